"""Metric sinks for experiment trackers: Weights & Biases, MLflow and trackio."""

__version__ = "0.1.0"
