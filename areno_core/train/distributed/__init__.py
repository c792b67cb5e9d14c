"""Training over several processes with torch.distributed (``--world-size``, ``--tp-size``).

See ``docs/distributed.md`` and :mod:`areno_core.train.distributed.backend`.
"""
