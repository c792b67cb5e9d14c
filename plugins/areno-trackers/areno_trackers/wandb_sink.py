"""``--report-to wandb``: a Weights & Biases run per ``areno train``.

Configured by W&B's own environment variables: ``WANDB_PROJECT`` (default ``areno``),
``WANDB_ENTITY``, ``WANDB_MODE`` (``offline`` writes the run under ``WANDB_DIR`` to upload
later with ``wandb sync``), ``WANDB_DIR`` (default: the run's output directory). The run is
named after the output directory; its config is the run's resolved options, every metric is
logged at its step, and the final checkpoint path goes to the run summary
(``checkpoint_path``). Online mode needs a key (``wandb login`` or ``WANDB_API_KEY``): without
one, the run stops before it starts.
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from areno_core.contracts.sink import RunInfo, SinkSpec
from areno_trackers.common import missing

OFFLINE_MODES = ("offline", "disabled", "dryrun")


def check_wandb() -> str | None:
    why = missing("wandb", "wandb")
    if why is not None:
        return why
    if os.environ.get("WANDB_MODE", "").lower() in OFFLINE_MODES:
        return None
    if os.environ.get("WANDB_API_KEY") or _netrc_key():
        return None
    return (
        "not logged in to Weights & Biases: run `wandb login`, set WANDB_API_KEY, or log "
        "offline with WANDB_MODE=offline (then `wandb sync` the run directory)"
    )


def _netrc_key() -> bool:
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or ""
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbSink:
    def __init__(self, run: RunInfo) -> None:
        import wandb  # optional: the [wandb] extra

        self._run: Any = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "areno"),
            entity=os.environ.get("WANDB_ENTITY") or None,
            name=run.name,
            dir=os.environ.get("WANDB_DIR") or str(run.output_dir),
            config=dict(run.config),
            reinit="create_new",
        )

    def log(self, metrics: Mapping[str, float | int], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def finish(self, checkpoint_path: str | None) -> None:
        if checkpoint_path is not None:
            self._run.summary["checkpoint_path"] = checkpoint_path
        self._run.finish()
        self._run = None

    def close(self) -> None:
        if self._run is not None:  # the run did not finish normally
            self._run.finish(exit_code=1)
            self._run = None


WANDB_SINK = SinkSpec(
    "wandb", "Weights & Biases (WANDB_PROJECT, WANDB_MODE=offline, ...)", WandbSink, check_wandb
)
