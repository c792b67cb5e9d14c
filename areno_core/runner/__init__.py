"""Rollout runners: one engine kept in step with the policy for a run's rollouts and held-out
evaluation (:mod:`~areno_core.runner.rollout`), in this process or in a worker process that
samples ahead of the trainer (:mod:`~areno_core.runner.async_rollout`,
:mod:`~areno_core.runner.worker`)."""
