"""``areno plan``: per-GPU memory of a training setup, predicted from the model shape."""
