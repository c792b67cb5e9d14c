"""Which runs ``--tune-params`` can tune, checked before anything is loaded."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from areno_core.errors import ConfigError, NotAvailableError

# The tuner's own settings: they do nothing without --tune-params.
TUNER_OPTIONS = ("mem_frac", "tune_max_samples")


def check_tunable(cfg: Any, spec: Any, flags: Collection[str] = ()) -> None:
    """Refuse ``--tune-params`` for a run it cannot tune (``cfg``: the run config, ``spec``:
    its algorithm), and a tuner setting typed among ``flags`` (the command line's options)
    without ``--tune-params``. A config file may restate them: a tuned run's own
    config.yaml does, with ``tune_params: false``."""
    if not cfg.tune_params:
        given = [name for name in TUNER_OPTIONS if name in flags]
        if given:
            raise ConfigError(
                ", ".join("--" + name.replace("_", "-") for name in given)
                + " only applies with --tune-params (it sizes the tuner's search); add "
                "--tune-params, or drop it"
            )
        return
    if not spec.needs_rollout:
        raise ConfigError(
            f"--tune-params tunes rollout concurrency and the batch it feeds; --algo {spec.name} "
            f"({spec.kind}) does not roll out. Set --batch-size and --mini-bs yourself"
        )
    if cfg.resume is not None:
        raise ConfigError(
            "--tune-params cannot change the batch of a run being resumed; resume with the "
            "tuned run's own settings (--config <run>/config.yaml --resume auto)"
        )
    if (cfg.world_size or 1) > 1 or (cfg.tp_size or 1) > 1:
        raise NotAvailableError(
            "--tune-params probes one process on one device; it is not available with "
            f"--world-size {cfg.world_size} --tp-size {cfg.tp_size} yet"
        )
