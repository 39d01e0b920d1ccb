"""Side-by-side measurements against transformers: inference speed (speed.py), whole
pre-training (pretrain.py) and fine-tuning (finetune.py) runs. transformers is imported only
inside the functions that run it. Imports anything below it; only the commands import it."""
