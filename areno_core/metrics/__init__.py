"""A run's metrics: the logger the loop and the Python API write through
(:mod:`~areno_core.metrics.logger`) and the sinks it writes to (:mod:`~areno_core.metrics.sinks`:
``metrics.jsonl``, TensorBoard; trackers come as plugins)."""
