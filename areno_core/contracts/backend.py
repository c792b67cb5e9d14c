"""The training-backend contract: what the run and the loop call on a backend.

A backend owns how training runs: devices and processes, microbatching, the optimizer, and how
checkpoints are written and read. The run picks one by ``--backend`` (or the first registered
backend whose ``check`` accepts the run's ``--world-size``/``--tp-size``) and then only uses the
members of :class:`TrainingBackend`. ``LocalBackend`` (one process) and ``DistributedBackend``
(several processes, :mod:`areno_core.train.distributed`) are built in; others register a
:class:`BackendSpec` through the ``register_backends`` hook.

Besides training and checkpoints, the protocol has three members a backend of several
processes answers differently from one process: ``model_dtype`` (what models load in),
``rollout_placement`` (where rollouts sample, :mod:`areno_core.rollout.placement`) and
``any_process`` (whether every process stops after the same step). ``LocalBackend`` shows the
one-process answers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from areno_core.options import NoOptions, check_spec_callables, make_options
from areno_core.types import TrainResult

if TYPE_CHECKING:
    import torch

    from areno_core.algorithm import AlgorithmSpec
    from areno_core.config import RunConfig
    from areno_core.model import TrainableModel
    from areno_core.rollout.placement import RolloutPlacement


SETUP_KEYWORDS: tuple[str, ...] = (
    "learning_rate",
    "min_lr",
    "lr_decay_steps",
    "lr_decay_style",
    "adam_betas",
    "weight_decay",
    "adam_8bit",
    "activation_checkpointing",
    "critic_lr",
)
"""The keyword arguments of :meth:`TrainingBackend.setup` (optimizers and schedulers); the run
passes those of its ``train`` keyword arguments."""


@runtime_checkable
class TrainingBackend(Protocol):
    """The whole contract between a run and its training backend."""

    device: str
    """Where the run loads the policy (and the roles) before ``setup``: ``"cpu"``, ``"cuda"``."""

    is_main_process: bool
    """Whether this process prints, logs metrics and writes run outputs (rank 0)."""

    def setup(self, model: TrainableModel, spec: AlgorithmSpec, **optimizer: Any) -> None:
        """Prepare ``model`` for ``spec`` before the first step: roles, optimizers and
        schedulers (the keywords of :data:`SETUP_KEYWORDS`). Called again with the same
        settings it does nothing."""

    def train(
        self,
        model: TrainableModel,
        data: Sequence[Any],
        *,
        algorithm: str | AlgorithmSpec,
        **options: Any,
    ) -> TrainResult:
        """One trainer step on ``data`` (dataset rows, or ``TrajectoryGroup`` objects for
        online algorithms). Increments ``model.step``, and ``model.optimizer_steps`` once per
        optimizer step that changed the policy. ``TrainResult.metrics`` holds ``train/*`` and
        ``time/train``."""

    def evaluate(
        self,
        model: TrainableModel,
        rows: Sequence[Mapping[str, Any]],
        *,
        algorithm: str | AlgorithmSpec,
        **options: Any,
    ) -> dict[str, float]:
        """Held-out loss statistics (``eval/*``) of a supervised or preference algorithm,
        without changing weights, optimizer state or random streams."""

    def save_checkpoint(
        self,
        model: TrainableModel,
        save_root: str | Path,
        *,
        trainer_state: Mapping[str, Any],
        config: Mapping[str, Any],
    ) -> Path:
        """Write ``<save_root>/step_<model.step>/`` completely or not at all (weights a Hugging
        Face ``from_pretrained`` loads, optimizer and random state, ``trainer_state``)."""

    def load_checkpoint(self, model: TrainableModel, path: str | Path) -> dict[str, Any]:
        """Restore a checkpoint into ``model`` (weights, optimizers, step counters, random
        streams) and return the ``trainer_state`` it was saved with."""

    def model_dtype(self, choice: str) -> torch.dtype:
        """The dtype the run loads models in for ``--dtype choice`` (``auto`` included) on
        this backend's device; a choice the backend cannot train in is a ``ValueError``."""

    def rollout_placement(self, model: TrainableModel) -> RolloutPlacement:
        """Where rollouts run (call after ``setup``): the module the engine samples from, what
        a weight sync hands the engine, and which block of each step's prompts this process
        samples."""

    def any_process(self, flag: bool) -> bool:
        """Whether ``flag`` holds in any process of the run (a collective when there are
        several): asked before each step whether Ctrl-C was pressed, so all stop together."""


def _any_shape(config: RunConfig) -> str | None:
    return None


Launcher = Callable[["RunConfig", Sequence[str]], bool]


@attrs.frozen
class BackendSpec:
    """What a training-backend plugin registers (``register_backends``).

    ``factory(config, options, registry)`` builds the backend for a run from the resolved run
    config, an instance of ``config_cls`` (the backend's own options, which become
    ``areno train`` flags) and the run's registry. ``check(config)`` says why this backend
    cannot run a config (for example more than one device), or returns None.

    ``launch(config, argv)``, when given, starts the processes the backend trains in: the run
    calls it after every check of the run passed, with the command's ``areno`` arguments
    (``argv``, for example ``["train", "--algo", "sft", ...]``). It returns True when it ran
    the training in processes it started (and they finished), False when training should go on
    in the calling process (for example because that process is one of the workers already).
    """

    name: str
    summary: str
    # (run config, the backend's options, the run's areno_core.registry.Registry)
    factory: Callable[[RunConfig, Any, Any], TrainingBackend]
    config_cls: type = NoOptions
    check: Callable[[RunConfig], str | None] = _any_shape
    launch: Launcher | None = None

    def __attrs_post_init__(self) -> None:
        check_spec_callables("backend", self.name, self.factory, launch=self.launch)

    def make_config(self, options: Any) -> Any:
        """Its config from a mapping or object of run options (declared fields only)."""
        return make_options(self.config_cls, options)


__all__ = ["BackendSpec", "TrainingBackend"]
