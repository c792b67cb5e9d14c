"""Load policy, reference, critic and reward models and their tokenizer from one reference.

A reference (``--ckpt``, ``--ref-ckpt``, ``--critic-ckpt``, ``--reward-ckpt``) is one of:

* ``random:<arch>[-<preset>][?key=value&...]``: a freshly initialised model with the byte
  tokenizer (see :mod:`areno_core.models.scratch`);
* a local directory written by ``save_pretrained`` (loaded without any network access);
* a Hugging Face model id such as ``Qwen/Qwen3-0.6B``. When the hub cannot be reached (offline
  mode, or a quick connection probe fails) only the local cache is tried, and a clear
  :class:`~areno_core.errors.ConfigError` is raised at once instead of retrying for minutes.

::

    model, tok = load_model_and_tokenizer("random:qwen3-tiny")
    critic = load_value_model("random:qwen3-tiny", role="critic")
    values = critic(input_ids, attention_mask)            # [B, T]
"""

from __future__ import annotations

import copy
import functools
import os
import re
import socket
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from areno_core.errors import ConfigError
from areno_core.log import get_logger
from areno_core.models.compat import (
    cache_argument,
    enable_activation_checkpointing,
    is_activation_checkpointing,
    output_cache,
)
from areno_core.models.kernel_caches import bound_kernel_caches
from areno_core.models.scratch import (
    build_random_config,
    build_random_model,
    is_random_ref,
    parse_random_ref,
)
from areno_core.models.tokenizer import build_byte_tokenizer

logger = get_logger(__name__)

T = TypeVar("T")

POLICY_ROLES: tuple[str, ...] = ("policy", "reference")
VALUE_ROLES: tuple[str, ...] = ("critic", "reward")
# Roles whose weights are never trained: loaded in eval mode with requires_grad off.
FROZEN_ROLES: frozenset[str] = frozenset({"reference", "reward"})

DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}

HUB_PROBE_TIMEOUT_S = 3.0
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_TRUE = ("1", "true", "yes", "on")


# --------------------------------------------------------------------------------------------
# reference resolution and the hub


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype | str:
    """``"auto"`` or a ``torch.dtype`` from a dtype or its name (``"bf16"``, ``"float32"``...)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).strip().lower().removeprefix("torch.")
    if name == "auto":
        return "auto"
    if name in DTYPE_NAMES:
        return DTYPE_NAMES[name]
    raise ConfigError(
        f"unknown dtype {dtype!r}; valid: auto, {', '.join(sorted(set(DTYPE_NAMES)))}"
    )


def _check_role(role: str, valid: tuple[str, ...]) -> None:
    if role not in valid:
        raise ConfigError(f"unknown model role {role!r}; valid roles: {', '.join(valid)}")


def _local_dir(ref: str) -> Path | None:
    """The directory ``ref`` names, None for a hub id; ConfigError for a missing local path."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ConfigError(f"model reference {ref!r} is a file; expected a checkpoint directory")
    looks_like_path = ref.startswith(("/", ".", "~")) or "\\" in ref or ref.count("/") > 1
    if looks_like_path or not _HUB_ID.match(ref):
        raise ConfigError(
            f"model reference {ref!r} is neither an existing directory nor a Hugging Face "
            "model id; use a local checkpoint directory, an id like 'org/name', or a "
            "'random:' reference such as 'random:qwen3-tiny'"
        )
    return None


def hub_offline_mode() -> bool:
    """Whether HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE forbid network access."""
    from huggingface_hub import constants  # only for hub model ids

    if constants.HF_HUB_OFFLINE:
        return True
    return any(
        os.environ.get(name, "").strip().lower() in _TRUE
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _hub_address() -> tuple[str, int]:
    """Host and port a hub request would connect to first (the proxy, when one is set)."""
    from huggingface_hub import constants  # only for hub model ids

    endpoint = urlsplit(constants.ENDPOINT)
    scheme = endpoint.scheme or "https"
    for name in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY", "all_proxy", "ALL_PROXY"):
        proxy = os.environ.get(name)
        if proxy:
            parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            if parts.hostname:
                return parts.hostname, parts.port or 80
    default_port = 443 if scheme == "https" else 80
    return endpoint.hostname or "huggingface.co", endpoint.port or default_port


@functools.lru_cache(maxsize=8)
def _can_connect(host: str, port: int, timeout: float) -> bool:
    """TCP connect within ``timeout`` seconds, name resolution included (it can hang too)."""
    result: list[bool] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    worker = threading.Thread(target=attempt, name="areno-hub-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    return bool(result and result[0])


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Quick TCP probe of the hub endpoint (or proxy); the answer is cached per address."""
    if hub_offline_mode():
        return False
    host, port = _hub_address()
    return _can_connect(host, port, timeout)


def _from_hub(ref: str, what: str, load: Callable[..., T]) -> T:
    """Call ``load(**kw)`` for a hub id, failing fast with a ConfigError when offline."""
    if not hub_reachable():
        try:
            return load(local_files_only=True)
        except (OSError, ValueError) as exc:
            logger.debug("local-cache load of %s failed: %s", ref, exc)
            raise ConfigError(
                f"{ref!r} is not a local directory, and the {what} for {ref!r} could not be "
                "downloaded: no Hugging Face hub is reachable (offline mode or no network) and "
                "it is not in the local cache. "
                "Pass a local checkpoint directory, or a 'random:' reference such as "
                "'random:qwen3-tiny' for a from-scratch model."
            ) from None
    try:
        return load()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"could not load the {what} for {ref!r}: {exc}") from exc


def _auto_model(auto_class: Any, **fixed: Any) -> Callable[..., Any]:
    """``auto_class.from_pretrained`` with ``fixed`` keywords. With ``local_files_only`` the
    adapter lookup that transformers makes when peft is installed stays local as well (it does
    not inherit the flag, and would otherwise try the hub with retries for ~20 s)."""

    def load(source: str, **kwargs: Any) -> Any:
        kwargs = {**fixed, **kwargs}
        if kwargs.get("local_files_only"):
            kwargs["adapter_kwargs"] = {
                **kwargs.get("adapter_kwargs", {}),
                "local_files_only": True,
            }
        return auto_class.from_pretrained(source, **kwargs)

    return load


def _pretrained(ref: str, what: str, load: Callable[..., T]) -> T:
    """Run ``load(source, **kw)`` for a local directory or a hub id."""
    local = _local_dir(ref)
    if local is not None:
        try:
            return load(str(local), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"could not load the {what} from {str(local)!r}: {exc}") from exc
    return _from_hub(ref, what, functools.partial(load, ref))


def _load_config(ref: str) -> PretrainedConfig:
    return _pretrained(ref, "model config", AutoConfig.from_pretrained)


def load_model_config(ref: str) -> PretrainedConfig:
    """The architecture config of a model reference, without loading any weights (a
    ``random:`` reference's config is built, a checkpoint's ``config.json`` is read)."""
    if is_random_ref(ref):
        return build_random_config(ref)
    return _load_config(ref)


def _finish(model: nn.Module, device: str | torch.device, role: str) -> None:
    model.to(torch.device(device))
    model.eval()
    if role in FROZEN_ROLES:
        model.requires_grad_(False)


# --------------------------------------------------------------------------------------------
# tokenizers and causal LMs


def ensure_pad_token(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Give a tokenizer without a pad token its eos token as pad (in place); return it."""
    if tokenizer.pad_token_id is not None:
        return tokenizer
    if tokenizer.eos_token is None:
        raise ConfigError(
            f"tokenizer {tokenizer.name_or_path!r} has neither a pad nor an eos token; "
            "add one to its tokenizer_config.json"
        )
    tokenizer.pad_token = tokenizer.eos_token
    logger.info("tokenizer has no pad token; using eos %r as pad", tokenizer.eos_token)
    return tokenizer


def load_tokenizer(ref: str) -> PreTrainedTokenizerBase:
    """The tokenizer for a model reference (the byte tokenizer for ``random:`` refs).

    A tokenizer without a pad token gets its eos token as pad. One without a chat template is
    accepted; plain-text prompts work and chat rows fall back with a warning.
    """
    if is_random_ref(ref):
        return build_byte_tokenizer(parse_random_ref(ref).chat_template)
    tokenizer = _pretrained(ref, "tokenizer", AutoTokenizer.from_pretrained)
    return ensure_pad_token(tokenizer)


def _random_lm(
    ref: str, dtype: torch.dtype | str, attn_implementation: str | None
) -> PreTrainedModel:
    """The ``random:`` causal LM ``ref`` in ``dtype`` (float32 for ``"auto"``), with
    ``attn_implementation`` when given."""
    model = build_random_model(ref, dtype=torch.float32 if dtype == "auto" else dtype)
    if attn_implementation is not None:
        model.set_attn_implementation(attn_implementation)
    return model


def _load_kwargs(dtype: torch.dtype | str, attn_implementation: str | None) -> dict[str, Any]:
    """``from_pretrained`` keywords: ``dtype``, and ``attn_implementation`` when given."""
    kwargs: dict[str, Any] = {"dtype": dtype}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    return kwargs


def load_model(
    ref: str,
    *,
    dtype: torch.dtype | str = "auto",
    device: str | torch.device = "cpu",
    role: str = "policy",
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """Load a causal LM for ``role`` (``policy`` or ``reference``).

    ``dtype="auto"`` keeps the checkpoint's stored dtype (float32 for ``random:`` models).
    The model comes back in eval mode; a ``reference`` model also has ``requires_grad`` off.
    """
    _check_role(role, POLICY_ROLES)
    resolved = resolve_dtype(dtype)
    bound_kernel_caches()  # before the model's first bfloat16 product on a CPU
    if is_random_ref(ref):
        model: PreTrainedModel = _random_lm(ref, resolved, attn_implementation)
    else:
        kwargs = _load_kwargs(resolved, attn_implementation)
        model = _pretrained(ref, "model", _auto_model(AutoModelForCausalLM, **kwargs))
    _finish(model, device, role)
    logger.info(
        "loaded %s model %s: %s parameters, %s on %s",
        role,
        ref,
        f"{sum(p.numel() for p in model.parameters()):,}",
        next(model.parameters()).dtype,
        device,
    )
    return model


def load_model_and_tokenizer(
    ref: str,
    *,
    dtype: torch.dtype | str = "auto",
    device: str | torch.device = "cpu",
    role: str = "policy",
    attn_implementation: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """:func:`load_model` and :func:`load_tokenizer` for the same reference."""
    tokenizer = load_tokenizer(ref)
    model = load_model(
        ref, dtype=dtype, device=device, role=role, attn_implementation=attn_implementation
    )
    vocab = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > vocab:
        raise ConfigError(
            f"tokenizer of {ref!r} has {len(tokenizer)} tokens but the model's embedding has "
            f"only {vocab} rows"
        )
    return model, tokenizer


# --------------------------------------------------------------------------------------------
# value models (critic / reward)


class ValueModel(nn.Module):
    """A transformer backbone plus a scalar head: one value per token.

    ``backbone`` maps ``input_ids`` to ``last_hidden_state`` [B, T, H]; ``head`` maps H to 1.
    Position ids are derived from the attention mask, so left- and right-padded rows score the
    same as the unpadded row.
    """

    def __init__(self, backbone: PreTrainedModel, head: nn.Linear) -> None:
        super().__init__()
        if head.out_features != 1:
            raise ValueError(f"value head must have 1 output, has {head.out_features}")
        self.backbone = backbone
        self.head = head

    @property
    def config(self) -> PretrainedConfig:
        return self.backbone.config

    @property
    def is_activation_checkpointing(self) -> bool:
        return is_activation_checkpointing(self.backbone)

    def activation_checkpointing_enable(self, *args: Any, **kwargs: Any) -> None:
        enable_activation_checkpointing(self.backbone)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Per-token values [B, T] (float32)."""
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        )
        return self.head(out.last_hidden_state).squeeze(-1).float()

    def score_last(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The value at each row's last non-pad token [B] (left or right padding)."""
        values = self(input_ids, attention_mask)
        positions = torch.arange(values.shape[-1], device=values.device)
        last = (positions * attention_mask.to(positions.dtype)).amax(dim=-1)
        return values.gather(-1, last.unsqueeze(-1)).squeeze(-1)

    def _meta_classifier(self) -> tuple[PreTrainedModel, str]:
        """The ``*ForSequenceClassification`` layout this model is saved in (on the meta
        device, so it costs no memory) and the name of its score head."""
        config = copy.deepcopy(self.backbone.config)
        config.num_labels = 1
        with torch.device("meta"):
            classifier = AutoModelForSequenceClassification.from_config(config)
        head_name = _score_head_name(classifier)
        if head_name is None:
            raise NotImplementedError(
                f"{type(classifier).__name__} has no single linear score head to save into"
            )
        return classifier, head_name

    def convert_saved_weights(self, weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Rename the tensors of a directory written by :meth:`save_pretrained` (``model.*``,
        ``score.*`` for Qwen3) to this module's names (``backbone.*``, ``head.*``), so a
        checkpoint's critic loads back strictly; other names are kept as they are."""
        classifier, head_name = self._meta_classifier()
        renames = {f"{classifier.base_model_prefix}.": "backbone.", f"{head_name}.": "head."}
        out: dict[str, torch.Tensor] = {}
        for key, value in weights.items():
            for old, new in renames.items():
                if key.startswith(old):
                    key = new + key[len(old) :]
                    break
            out[key] = value
        return out

    def save_pretrained(self, path: str | os.PathLike[str]) -> None:
        """Save as a ``*ForSequenceClassification`` checkpoint (num_labels=1).

        :func:`load_value_model` on the saved directory restores the same backbone and head,
        and so does :func:`areno_core.train.checkpoint.load_module_weights` on a live
        ``ValueModel`` (through :meth:`convert_saved_weights`).
        """
        classifier, head_name = self._meta_classifier()
        state = {
            f"{classifier.base_model_prefix}.{key}": value
            for key, value in self.backbone.state_dict().items()
        }
        state.update({f"{head_name}.{k}": v for k, v in self.head.state_dict().items()})
        classifier.load_state_dict(state, strict=True, assign=True)
        classifier.save_pretrained(path)


def _score_head_name(classifier: PreTrainedModel) -> str | None:
    for name, module in classifier.named_children():
        if name != classifier.base_model_prefix and isinstance(module, nn.Linear):
            return name
    return None


def _has_sequence_head(config: PretrainedConfig) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in (config.architectures or []))


def _fresh_head(hidden_size: int, std: float, dtype: torch.dtype, seed: int) -> nn.Linear:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = nn.Linear(hidden_size, 1, bias=False)
        nn.init.normal_(head.weight, mean=0.0, std=std)
    return head.to(dtype=dtype)


def load_value_model(
    ref: str,
    *,
    dtype: torch.dtype | str = "auto",
    device: str | torch.device = "cpu",
    role: str = "critic",
    attn_implementation: str | None = None,
) -> ValueModel:
    """A :class:`ValueModel` for ``role`` (``critic`` or ``reward``).

    A checkpoint saved with a ``*ForSequenceClassification`` head (num_labels=1) keeps that
    head; any other checkpoint (a causal LM, or a ``random:`` ref) gets its transformer
    backbone plus a fresh, deterministically initialised scalar head. A ``reward`` model comes
    back frozen (eval mode, requires_grad off).
    """
    _check_role(role, VALUE_ROLES)
    resolved = resolve_dtype(dtype)
    bound_kernel_caches()  # before the model's first bfloat16 product on a CPU
    kwargs = _load_kwargs(resolved, attn_implementation)
    if is_random_ref(ref):
        lm = _random_lm(ref, resolved, attn_implementation)
        backbone: PreTrainedModel = lm.model
        head = _fresh_head(
            lm.config.hidden_size,
            lm.config.initializer_range,
            lm.dtype,
            seed=parse_random_ref(ref).seed,
        )
        model = ValueModel(backbone, head)
    else:
        config = _load_config(ref)
        if _has_sequence_head(config):
            if getattr(config, "num_labels", 1) != 1:
                raise ConfigError(
                    f"{ref!r} is a classifier with {config.num_labels} labels; a value or "
                    "reward model needs exactly one"
                )
            classifier = _pretrained(
                ref,
                "value model",
                _auto_model(AutoModelForSequenceClassification, **kwargs),
            )
            head_name = _score_head_name(classifier)
            if head_name is None:
                raise ConfigError(f"{ref!r} has no single linear score head")
            backbone = getattr(classifier, classifier.base_model_prefix)
            model = ValueModel(backbone, getattr(classifier, head_name))
        else:
            backbone = _pretrained(ref, "value model backbone", _auto_model(AutoModel, **kwargs))
            head = _fresh_head(
                backbone.config.hidden_size,
                getattr(backbone.config, "initializer_range", 0.02),
                backbone.dtype,
                seed=0,
            )
            model = ValueModel(backbone, head)
            logger.info("value model %s: causal LM backbone with a fresh scalar head", ref)
    _finish(model, device, role)
    return model


__all__ = [
    "DTYPE_NAMES",
    "FROZEN_ROLES",
    "POLICY_ROLES",
    "VALUE_ROLES",
    "ValueModel",
    "cache_argument",
    "ensure_pad_token",
    "hub_offline_mode",
    "hub_reachable",
    "load_model",
    "load_model_and_tokenizer",
    "load_model_config",
    "load_tokenizer",
    "load_value_model",
    "output_cache",
    "resolve_dtype",
]
