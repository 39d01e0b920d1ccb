"""Training: the one loop (loop.py), run folders and their checkpoints (runs.py), pre-training
(pretrain.py), fine-tuning (finetune.py) and the curves of a run (curves.py). Imports the
network, the data, the task objects and the files; only the commands and the benchmarks import
it."""
