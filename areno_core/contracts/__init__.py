"""What a plugin implements, as the registry knows it: the rollout-engine contract
(:mod:`~areno_core.contracts.engine`), the training-backend contract
(:mod:`~areno_core.contracts.backend`) and the metric-sink contract
(:mod:`~areno_core.contracts.sink`).

These modules stand low in the core's layers (above options and types only), so the registry
can check what plugins register without importing any implementation.
"""
