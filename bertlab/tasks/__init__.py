"""One object per task: a batch in, a loss and metrics out, for bertlab.train.loop."""
