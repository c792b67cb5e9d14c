"""Training infrastructure: optimizer and LR schedule, checkpoints, metrics, progress display."""
