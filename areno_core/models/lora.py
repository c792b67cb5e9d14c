"""LoRA adapters on the policy, through PEFT (``pip install 'areno-core[lora]'``).

::

    settings = LoraSettings(rank=16)                   # --lora-rank 16
    adapter = LoraAdapter.attach(policy, settings, base="Qwen/Qwen3-0.6B")
    # ``policy`` is the same module as before, with adapter layers inside its projections;
    # only their weights require grad, so the optimizer holds (and updates) nothing else.
    reference = adapter.reference_view()               # the base: adapters switched off
    adapter.save(directory)                            # PEFT's format (adapter_config.json, ...)
    adapter.save_merged(directory, tokenizer)          # a plain Hugging Face model

The policy stays the module that is trained, sampled from and scored, so everything that runs
a policy (the native rollout engine, the loss, activation checkpointing) runs the adapted model
unchanged. The reference model of DPO and PPO is the same module with its adapters switched
off: no second copy of the weights. An external rollout engine says how it takes a LoRA
policy's weights with ``EngineSpec.lora_weights`` (see :func:`weights_for_engine`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import attrs
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from areno_core.errors import ConfigError, NotAvailableError
from areno_core.log import get_logger
from areno_core.models.compat import is_activation_checkpointing

logger = get_logger(__name__)

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
MERGED_DIR = "merged"
# What PEFT puts before the adapted model's own parameter names (``PeftModel.state_dict()``).
PEFT_PREFIX = "base_model.model."
ALL_LINEAR = "all-linear"

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_ATTENTION_AND_MLP = (*_ATTENTION, "gate_proj", "up_proj", "down_proj")
# Every attention and MLP projection, by model family (``config.model_type``). A family not
# listed gets PEFT's ``all-linear``: every linear layer except the output layer.
DEFAULT_TARGET_MODULES: dict[str, tuple[str, ...]] = {
    "qwen3": _ATTENTION_AND_MLP,
    "qwen2": _ATTENTION_AND_MLP,
    "llama": _ATTENTION_AND_MLP,
    "mistral": _ATTENTION_AND_MLP,
    "gemma": _ATTENTION_AND_MLP,
    "gemma2": _ATTENTION_AND_MLP,
    "gemma3_text": _ATTENTION_AND_MLP,
    "olmo2": _ATTENTION_AND_MLP,
    "phi3": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
    # Mixtures of experts: transformers keeps the experts' weights as fused 3D parameters,
    # not linear layers, so the adapters go on the attention projections.
    "qwen3_moe": _ATTENTION,
    "gpt_oss": _ATTENTION,
}

# How a rollout engine takes the weights of a policy trained with LoRA (``EngineSpec``):
# "module" the live module (it samples from the training module itself), "merged" a state dict
# of the merged weights under the base model's names, "adapter" an :class:`AdapterWeights`.
LoraWeights = Literal["module", "merged", "adapter"]
LORA_WEIGHTS: tuple[str, ...] = ("module", "merged", "adapter")


def check_peft_available() -> None:
    """Raise :class:`NotAvailableError` unless PEFT can be imported (checked before loading)."""

    if importlib.util.find_spec("peft") is None:
        raise NotAvailableError(
            "--lora-rank needs the peft package: pip install 'areno-core[lora]' (or pip "
            "install peft)"
        )


def _peft() -> Any:
    check_peft_available()
    import peft  # optional extra areno-core[lora]

    return peft


def parse_target_modules(text: str | None) -> tuple[str, ...] | None:
    """``"q_proj, v_proj"`` -> ``("q_proj", "v_proj")``; None or blank -> None (the default)."""
    if text is None or not text.strip():
        return None
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if ALL_LINEAR in names and len(names) > 1:
        raise ConfigError(
            f"--lora-target-modules {text!r}: {ALL_LINEAR!r} already names every linear layer; "
            "give it alone or list module names"
        )
    return names


@attrs.frozen
class LoraSettings:
    """The adapter of a run (``--lora-rank``, ``--lora-alpha``, ``--lora-dropout``,
    ``--lora-target-modules``, ``--save-merged``).

    ``alpha`` None means ``2 * rank`` (the adapter's output is scaled by ``alpha / rank``);
    ``target_modules`` None means the model family's default (:data:`DEFAULT_TARGET_MODULES`).
    """

    rank: int = attrs.field(validator=attrs.validators.gt(0))
    alpha: float | None = None
    dropout: float = 0.0
    target_modules: tuple[str, ...] | None = None
    save_merged: bool = False

    @property
    def scaling_alpha(self) -> float:
        return float(self.alpha) if self.alpha is not None else 2.0 * self.rank

    @classmethod
    def from_config(cls, cfg: Any) -> LoraSettings | None:
        """The settings of a resolved run config; None when it trains every weight."""
        if cfg.lora_rank is None:
            return None
        return cls(
            rank=cfg.lora_rank,
            alpha=cfg.lora_alpha,
            dropout=cfg.lora_dropout,
            target_modules=parse_target_modules(cfg.lora_target_modules),
            save_merged=cfg.save_merged,
        )


def linear_layer_names(model: nn.Module) -> list[str]:
    """The distinct last-name parts of ``model``'s linear layers, output layer left out."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and module is not output and name
    }
    return sorted(names)


def resolve_target_modules(model: nn.Module, requested: tuple[str, ...] | None) -> list[str] | str:
    """The modules to adapt in ``model``: ``requested`` (each must name a linear layer), else
    its family's default; ``"all-linear"`` for families without one."""
    available = linear_layer_names(model)
    if requested is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        default = DEFAULT_TARGET_MODULES.get(str(model_type))
        if default is None or not set(default) <= set(available):
            return ALL_LINEAR
        return list(default)
    if requested == (ALL_LINEAR,):
        return ALL_LINEAR
    missing = [n for n in requested if n not in available]
    if missing:
        raise ConfigError(
            f"--lora-target-modules: {', '.join(repr(n) for n in missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not a linear layer of "
            f"{type(model).__name__}; its linear layers are: {', '.join(available)} (or give "
            f"{ALL_LINEAR!r})"
        )
    return list(requested)


@attrs.frozen
class AdapterWeights:
    """A LoRA adapter in PEFT's format, as an engine with ``lora_weights="adapter"`` gets it.

    ``config`` is the content of ``adapter_config.json`` and ``tensors`` that of
    ``adapter_model.safetensors`` (PEFT's names, e.g.
    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``); :meth:`save` writes
    both, which is what engines that load LoRA adapters from a directory read.
    """

    config: Mapping[str, Any]
    tensors: Mapping[str, torch.Tensor]
    base: str | None = None

    def save(self, directory: str | Path) -> Path:

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / ADAPTER_CONFIG_FILE).write_text(json.dumps(dict(self.config), indent=2))
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.tensors.items()}
        save_file(tensors, str(directory / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})
        return directory


class LoraAdapter:
    """A PEFT LoRA adapter attached to a policy module (see the module docstring)."""

    def __init__(self, peft_model: Any, settings: LoraSettings, base: str | None = None) -> None:
        self.peft_model = peft_model
        self.settings = settings
        self.base = base
        self._view: BaseModelView | None = None

    @classmethod
    def attach(
        cls, policy: nn.Module, settings: LoraSettings, *, base: str | None = None
    ) -> LoraAdapter:
        """Put LoRA layers into ``policy`` (in place) and freeze every other weight.

        The new ``lora_A`` weights are drawn from torch's global generator and ``lora_B`` is
        zero, so the adapted policy starts out equal to the base. ``base`` names the base
        model in ``adapter_config.json`` (``base_model_name_or_path``).
        """
        peft = _peft()
        if getattr(policy, "peft_config", None) is not None or any(
            _is_lora_layer(m) for m in policy.modules()
        ):
            raise ValueError("this policy already carries LoRA adapters")
        targets = resolve_target_modules(policy, settings.target_modules)
        config = peft.LoraConfig(
            r=settings.rank,
            lora_alpha=settings.scaling_alpha,
            lora_dropout=settings.dropout,
            target_modules=targets,
            bias="none",
            task_type="CAUSAL_LM",
        )
        with warnings.catch_warnings():
            # PEFT reads transformers' deprecated is_gradient_checkpointing property.
            warnings.simplefilter("ignore", FutureWarning)
            peft_model = peft.get_peft_model(policy, config)
        peft_model.peft_config["default"].base_model_name_or_path = base
        adapter = cls(peft_model, settings, base)
        trainable = sum(p.numel() for p in adapter.trainable_parameters())
        total = sum(p.numel() for p in policy.parameters())
        logger.info(
            "LoRA rank %d, alpha %g on %s: %s trainable parameters of %s (%.2f%%)",
            settings.rank,
            settings.scaling_alpha,
            targets if isinstance(targets, str) else ", ".join(targets),
            f"{trainable:,}",
            f"{total:,}",
            100.0 * trainable / max(total, 1),
        )
        return adapter

    @property
    def policy(self) -> nn.Module:
        """The adapted module (the one given to :meth:`attach`)."""
        return self.peft_model.base_model.model

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.policy.parameters() if p.requires_grad]

    def num_trainable(self) -> int:
        return sum(p.numel() for p in self.trainable_parameters())

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Inside, the policy computes as its base model (every adapter switched off)."""
        with self.peft_model.disable_adapter():
            yield

    def reference_view(self) -> BaseModelView:
        """The base model as a reference: calls run the policy with its adapters off."""
        if self._view is None:
            self._view = BaseModelView(self)
        return self._view

    # -- weights ----------------------------------------------------------------------------

    def adapter_state_dict(
        self, weights: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """The adapter's weights under PEFT's saved names (what :meth:`save` writes).

        ``weights``: read them from this state dict of the adapted policy (its own names,
        e.g. ``...q_proj.lora_A.default.weight``; only the adapter's entries are needed)
        instead of the live policy: the distributed backend passes the gathered weights of a
        sharded one."""
        if weights is None:
            return _adapter_state_dict(self.peft_model)
        prefixed = {f"{PEFT_PREFIX}{k}": v for k, v in weights.items() if ".lora_" in k}
        peft = _peft()
        return dict(
            peft.get_peft_model_state_dict(
                self.peft_model, state_dict=prefixed, save_embedding_layers=False
            )
        )

    def adapter_config(self) -> dict[str, Any]:
        """The content of ``adapter_config.json``."""
        config = self.peft_model.peft_config["default"].to_dict()
        return {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}

    def adapter_weights(self, module: nn.Module | None = None) -> AdapterWeights:
        """The adapter as an engine takes it; ``module``: read its weights from this full
        (unsharded) copy of the adapted policy instead of the policy itself."""
        weights = None if module is None else module.state_dict()
        return AdapterWeights(self.adapter_config(), self.adapter_state_dict(weights), self.base)

    def merged_state_dict(self, module: nn.Module | None = None) -> dict[str, torch.Tensor]:
        """The policy's weights with every adapter merged in (see :func:`merged_state_dict`);
        ``module``: a full (unsharded) copy of the adapted policy to read instead."""
        return merged_state_dict(self.policy if module is None else module)

    def save(self, directory: str | Path) -> None:
        """Write the adapter in PEFT's format: ``PeftModel.from_pretrained(base, directory)``
        loads it."""
        save_adapter(self.peft_model, directory)

    def save_merged(self, directory: str | Path, tokenizer: Any = None) -> None:
        """Write a plain Hugging Face model (``AutoModelForCausalLM.from_pretrained`` loads
        it) with the adapters merged into the base weights, and the tokenizer beside it."""
        save_merged(self.policy, directory, tokenizer)

    def load(self, directory: str | Path) -> None:
        """Load the adapter weights that :meth:`save` wrote (see :func:`load_adapter_weights`)."""
        load_adapter_weights(self.peft_model, directory)


@torch.no_grad()
def merged_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The weights of ``module`` (a model with PEFT's LoRA layers inside) with every adapter
    merged in, under the base model's names (``...q_proj.weight``): what the base model's
    ``load_state_dict`` takes. Computed without touching the live weights; merged in float32,
    then cast to each weight's dtype."""
    owners = {name: m for name, m in module.named_modules() if _is_lora_layer(m)}
    merged: dict[str, torch.Tensor] = {}
    for key, value in module.state_dict().items():
        if ".lora_" in key:
            continue
        owner, sep, param = key.rpartition(".base_layer.")
        if not sep or owner not in owners:
            merged[key] = value
            continue
        if param == "weight":
            delta = owners[owner].get_delta_weight("default")
            value = (value.float() + delta.float()).to(value.dtype)
        merged[f"{owner}.{param}"] = value
    return merged


def save_merged(module: nn.Module, directory: str | Path, tokenizer: Any = None) -> None:
    """Write ``module`` (a Hugging Face model with LoRA layers inside) as a plain Hugging Face
    model with the adapters merged into the base weights, and ``tokenizer`` beside it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    module.save_pretrained(str(directory), state_dict=merged_state_dict(module))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))


def _adapter_state_dict(peft_model: Any) -> dict[str, torch.Tensor]:
    # Embeddings are never adapted here; "auto" would ask the hub about the base model.
    peft = _peft()
    return dict(peft.get_peft_model_state_dict(peft_model, save_embedding_layers=False))


def save_adapter(peft_model: Any, directory: str | Path) -> None:
    """Write ``peft_model``'s adapter in PEFT's format (``adapter_config.json``,
    ``adapter_model.safetensors``), without asking any hub about the base model."""
    peft_model.save_pretrained(str(directory), save_embedding_layers=False)


def load_adapter_weights(peft_model: Any, directory: str | Path) -> None:
    """Load ``adapter_model.safetensors`` from ``directory`` into ``peft_model`` strictly
    (same names, same shapes); a :class:`ConfigError` says what does not match."""

    peft = _peft()
    directory = Path(directory)
    path = directory / ADAPTER_WEIGHTS_FILE
    if not path.is_file():
        raise ConfigError(
            f"{directory} holds no LoRA adapter ({ADAPTER_WEIGHTS_FILE} is missing); it was "
            "saved by a run without --lora-rank"
        )
    weights = load_file(str(path), device="cpu")
    expected = _adapter_state_dict(peft_model)
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} tensor(s), e.g. {', '.join(missing[:3])}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected, e.g. {', '.join(unexpected[:3])}")
        raise ConfigError(
            f"{directory}: the adapter does not match this model's LoRA layers ("
            + "; ".join(parts)
            + "); use the same --lora-target-modules as the run that saved it"
        )
    for key, tensor in weights.items():
        if tensor.shape != expected[key].shape:
            raise ConfigError(
                f"{directory}: adapter tensor {key} has shape {tuple(tensor.shape)}, this "
                f"model's has {tuple(expected[key].shape)}; use the same --lora-rank as the "
                "run that saved it"
            )
    peft.set_peft_model_state_dict(peft_model, weights)


class BaseModelView:
    """The base model of a LoRA policy, for scoring: calling it runs the policy with every
    adapter switched off and in eval mode, so it computes exactly what the base model would.

    It holds no weights of its own (it is not an ``nn.Module``: freezing or moving it must not
    touch the policy). Attributes not defined here are read from the policy.
    """

    def __init__(self, adapter: LoraAdapter) -> None:
        self._adapter = adapter

    @property
    def policy(self) -> nn.Module:
        return self._adapter.policy

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        policy = self.policy
        was_training = policy.training
        policy.eval()
        try:
            with self._adapter.disabled():
                return policy(*args, **kwargs)
        finally:
            policy.train(was_training)

    @property
    def forward(self) -> Callable[..., Any]:
        # The policy's signature, so callers that inspect it (logits_to_keep) see the same.
        @functools.wraps(self.policy.forward)
        def run(*args: Any, **kwargs: Any) -> Any:
            return self(*args, **kwargs)

        return run

    @property
    def is_activation_checkpointing(self) -> bool:

        return is_activation_checkpointing(self.policy)

    @property
    def training(self) -> bool:
        return False

    def eval(self) -> BaseModelView:
        return self

    def requires_grad_(self, requires_grad: bool = True) -> BaseModelView:
        return self  # never trained; the policy's own flags are not this view's to change

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)


def weights_for_engine(model: Any, mode: str, module: nn.Module | None = None) -> Any:
    """What ``engine.sync_weights`` receives for the policy of ``model`` (a TrainableModel):
    the policy module without an adapter (as always) or for ``mode="module"``; with an adapter,
    the merged state dict (``"merged"``) or the :class:`AdapterWeights` (``"adapter"``).

    ``module``: the full, current copy of the adapted policy that rollouts sample from (the
    distributed backend's gathered replica of its sharded policy); the policy by default."""
    adapter = getattr(model, "adapter", None)
    source = model.policy if module is None else module
    if adapter is None or mode == "module":
        return source
    if mode == "merged":
        return merged_state_dict(source)
    if mode == "adapter":
        return adapter.adapter_weights(None if source is model.policy else source)
    raise ValueError(f"unknown lora_weights mode {mode!r}; valid: {', '.join(LORA_WEIGHTS)}")


def checkpoint_exports(model: Any) -> dict[str, Callable[[Path], None]]:
    """Extra directories a checkpoint of ``model`` gets: ``merged/`` (the adapted policy as a
    plain Hugging Face model) when its adapter asks for it (``--save-merged``)."""
    adapter = getattr(model, "adapter", None)
    if adapter is None or not adapter.settings.save_merged:
        return {}
    return {MERGED_DIR: lambda directory: adapter.save_merged(directory, model.tokenizer)}


def check_resume_adapter(path: str | Path, settings: LoraSettings | None) -> None:
    """Refuse (before any model is loaded) to resume checkpoint ``path`` with LoRA options
    that do not fit it: an adapter checkpoint without ``--lora-rank``, a full one with it, or
    another rank or alpha than the saved adapter's."""
    path = Path(path)
    config_file = path / ADAPTER_CONFIG_FILE
    where = f"--resume {str(path)!r}"
    if not config_file.is_file():
        if settings is not None:
            raise ConfigError(
                f"{where} holds full weights (a run without LoRA); resume it without "
                "--lora-rank, or start a new LoRA run from it with --ckpt"
            )
        return
    saved = json.loads(config_file.read_text())
    if settings is None:
        raise ConfigError(
            f"{where} holds a LoRA adapter (rank {saved.get('r')}); resume it with the same "
            f"LoRA options (--lora-rank {saved.get('r')} ...)"
        )
    if saved.get("r") != settings.rank or float(saved.get("lora_alpha", 0)) != float(
        settings.scaling_alpha
    ):
        raise ConfigError(
            f"{where} holds a LoRA adapter of rank {saved.get('r')} and alpha "
            f"{saved.get('lora_alpha')}; this run asks for rank {settings.rank} and alpha "
            f"{settings.scaling_alpha:g}. Resume with the saved run's options"
        )


def _is_lora_layer(module: nn.Module) -> bool:
    try:
        from peft.tuners.lora import LoraLayer  # optional extra areno-core[lora]
    except ImportError:
        return False
    return isinstance(module, LoraLayer)


__all__ = [
    "ADAPTER_CONFIG_FILE",
    "ADAPTER_WEIGHTS_FILE",
    "ALL_LINEAR",
    "DEFAULT_TARGET_MODULES",
    "LORA_WEIGHTS",
    "MERGED_DIR",
    "PEFT_PREFIX",
    "AdapterWeights",
    "BaseModelView",
    "LoraAdapter",
    "LoraSettings",
    "LoraWeights",
    "check_peft_available",
    "check_resume_adapter",
    "checkpoint_exports",
    "linear_layer_names",
    "load_adapter_weights",
    "merged_state_dict",
    "parse_target_modules",
    "resolve_target_modules",
    "save_adapter",
    "save_merged",
    "weights_for_engine",
]
