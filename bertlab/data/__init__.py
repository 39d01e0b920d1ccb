"""Data for pre-training and fine-tuning: masking, corpus preparation, task datasets."""
