"""A lean forward pass for Llama-family decoders (Qwen3, Qwen2, Llama).

A transformers model spends a few milliseconds per call outside its kernels on a CPU: the
module tree, mask construction, output wrappers. For a decode step of a small model, or any
step of a tiny one, that overhead is most of the time. :class:`LeanDecoder` reads the weights
of such a model and runs the same computation as a plain sequence of tensor operations:

It reuses the module's own parameters (whatever their dtype: float32, or bfloat16 under
``--dtype bfloat16``) and issues the same operations in the same order as the transformers code
with SDPA attention (the same masks and the same grouped-query path), so on the same machine it
returns the same logits as the module, bit for bit in float32 (in bfloat16, attention runs in
float32 on a CPU, see :func:`sdpa`, so the logits are close to the module's, not identical).

Inference uses it (the rollout engine); :mod:`areno_core.train.packed` builds the training
forward from the same pieces; see :func:`lean_unavailable_reason` for what a
model must look like.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch
import torch.nn.functional as F
from torch import nn

from areno_core.errors import NotAvailableError

# Model types whose transformers implementation is the plain pre-norm Llama block (Qwen3 adds
# per-head RMSNorm on queries and keys; Qwen2 adds query/key/value biases).
SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("qwen3", "qwen2", "llama")
_CAUSAL_LM_CLASSES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM")

# Writes one layer's new keys/values [B, kv_heads, T, head_dim] and returns what attention
# reads: (keys, values) over the whole visible window.
KVWriter = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# Replaces writing and attending in one layer: (layer index, queries [B, H, T, D], new keys,
# new values [B, kv_heads, T, D]) -> attention output [B, T, H, D].
Attender = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def lean_unavailable_reason(model: nn.Module, *, require_sdpa: bool = True) -> str | None:
    """Why :class:`LeanDecoder` cannot run ``model`` (None when it can).

    It needs a transformers ``Qwen3ForCausalLM``, ``Qwen2ForCausalLM`` or ``LlamaForCausalLM``
    with SiLU MLPs, full attention in every layer, plain ``nn.Linear`` / ``nn.Embedding``
    modules (no adapters or quantized layers) and no forward hooks. ``require_sdpa``: the
    model must also be set to SDPA attention (the lean pass always uses SDPA, so only then
    does it give the module's own numbers).

    Activation checkpointing on the module does not matter: decoding records no gradients,
    and the packed training forward (:mod:`areno_core.train.packed`) checkpoints its layers
    itself.
    """
    cls = type(model)
    if cls.__name__ not in _CAUSAL_LM_CLASSES or not cls.__module__.startswith("transformers."):
        return f"{cls.__name__} is not one of {', '.join(_CAUSAL_LM_CLASSES)}"
    config = model.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {config.model_type!r} is not supported"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} is not silu"
    layer_types = getattr(config, "layer_types", None) or ()
    if any(t != "full_attention" for t in layer_types):
        return "some layers do not use full attention"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    implementation = getattr(config, "_attn_implementation", None)
    if require_sdpa and implementation != "sdpa":
        return f"attention implementation is {implementation!r}, not 'sdpa'"
    if torch.nn.modules.module._global_forward_hooks or (
        torch.nn.modules.module._global_forward_pre_hooks
    ):
        return "global module hooks are registered"
    # transformers' enable_input_require_grads (run when activation checkpointing is turned
    # on) marks the embedding output as requiring gradients with a forward hook; neither the
    # lean decode (no gradients) nor the packed training forward (non-reentrant checkpoints)
    # needs it, so that one hook does not count.
    benign = {handle.id for handle in getattr(model, "_require_grads_hooks", None) or ()}
    for name, module in model.named_modules():
        if module._forward_pre_hooks or any(key not in benign for key in module._forward_hooks):
            return f"module {name or '<root>'} has forward hooks"
        if isinstance(module, nn.Linear) and type(module) is not nn.Linear:
            return f"module {name} is a {type(module).__name__}, not a plain nn.Linear"
        if isinstance(module, nn.Embedding) and type(module) is not nn.Embedding:
            return f"module {name} is a {type(module).__name__}, not a plain nn.Embedding"
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        if type(getattr(model.model.layers[0].self_attn, name, None)) is not nn.Linear:
            return f"attention has no plain {name}"
    for name in ("gate_proj", "up_proj", "down_proj"):
        if type(getattr(model.model.layers[0].mlp, name, None)) is not nn.Linear:
            return f"MLP has no plain {name}"
    return None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm exactly as the transformers Llama-family modules compute it."""
    dtype = x.dtype
    # (a float32 input skips the two casts, which return it unchanged, for their dispatch cost)
    h = x if dtype == torch.float32 else x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * (h if dtype == torch.float32 else h.to(dtype))


def rotary_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary module's ``cos``/``sin`` [B, T, D] as :func:`apply_rotary_tables` reads
    them (built once per forward pass, used by every layer): broadcast over the heads, and
    ``sin`` with its first half negated, the sign that transformers' ``rotate_half`` gives
    the rotated half of ``x`` (``(-x) * s`` and ``x * (-s)`` are the same number)."""
    half = sin.shape[-1] // 2
    signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return cos.unsqueeze(1), signed.unsqueeze(1)


def apply_rotary_tables(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of ``q``/``k`` [B, H, T, D] with :func:`rotary_tables`: the values of
    transformers' ``q * cos + rotate_half(q) * sin`` bit for bit, in fewer operations (the
    halves swap in one ``roll``; the sign is in ``signed_sin``)."""
    half = q.shape[-1] // 2
    return (q * cos) + (q.roll(half, -1) * signed_sin), (k * cos) + (k.roll(half, -1) * signed_sin)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of ``q``/``k`` [B, H, T, D] with ``cos``/``sin`` [B, T, D]."""
    return apply_rotary_tables(q, k, *rotary_tables(cos, sin))


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    if n_rep == 1:
        return x
    batch, heads, length, dim = x.shape
    x = x[:, :, None].expand(batch, heads, n_rep, length, dim)
    return x.reshape(batch, heads * n_rep, length, dim)


def sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    n_rep: int,
    scaling: float,
) -> torch.Tensor:
    """Causal attention the way transformers' SDPA integration runs it; returns [B, T, H, D].

    ``mask`` is None (every key visible; causal when there are several queries) or a boolean
    [B, 1, T, K] mask (True: attend). Grouped-query attention uses the same three paths as
    transformers: ``enable_gqa`` without a mask, one query folded over the key/value heads
    with a mask, and repeated keys/values otherwise.

    On a CPU, bfloat16 and float16 inputs are attended in float32 and the result is cast back:
    torch's CPU attention kernel in bfloat16 measured 2.4x slower than in float32 on a decode
    step (docs/performance.md), and float32 is the more accurate of the two.
    """
    dtype = q.dtype
    if q.device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        return sdpa(q.float(), k.float(), v.float(), mask, n_rep, scaling).to(dtype)
    q_len = q.shape[2]
    kwargs: dict[str, Any] = {}
    if n_rep > 1:
        if mask is None and k.shape[-1] == v.shape[-1] <= 256:
            kwargs["enable_gqa"] = True
        elif q_len == 1:
            q = q.reshape(q.shape[0], q.shape[1] // n_rep, n_rep, q.shape[-1])
        else:
            k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
    is_causal = q_len > 1 and mask is None
    if is_causal and k.shape[2] > q_len:
        k, v = k[:, :, :q_len], v[:, :, :q_len]
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=0.0, scale=scaling, is_causal=is_causal, **kwargs
    )
    out = out.reshape(out.shape[0], -1, q_len, v.shape[-1])
    return out.transpose(1, 2).contiguous()


@attrs.define
class _Linear:
    weight: torch.Tensor
    bias: torch.Tensor | None
    # The weight reordered for oneDNN (LeanDecoder.prepacked); only while no gradient is taken.
    packed: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and not torch.is_grad_enabled():
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


@attrs.frozen
class _Layer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    q: _Linear
    k: _Linear
    v: _Linear
    o: _Linear
    gate: _Linear
    up: _Linear
    down: _Linear


def _linear(module: nn.Linear) -> _Linear:
    return _Linear(module.weight, module.bias)


_LAYER_LINEARS = ("q", "k", "v", "o", "gate", "up", "down")


def prepack_unavailable_reason(model: nn.Module) -> str | None:
    """Why :meth:`LeanDecoder.prepacked` would not pay for ``model`` (None: it would): it
    reorders bfloat16 weights on a CPU whose oneDNN has bfloat16 products (the same check as
    ``areno_core.accel.precision.cpu_has_bf16``: AVX512-BF16 or AMX)."""
    weight = next(model.parameters(), None)
    if weight is None or weight.device.type != "cpu" or weight.dtype != torch.bfloat16:
        return "its weights are not bfloat16 on a CPU"
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return "torch's oneDNN has no bfloat16 products on this CPU"
    return None


def _layout_fingerprint(model: nn.Module) -> tuple[tuple[int, int, torch.dtype], ...]:
    """Identity, storage and dtype of every parameter (a move to another device or dtype
    changes it; an in-place update does not)."""
    return tuple((id(p), p.data_ptr(), p.dtype) for p in model.parameters())


_CHECKED: weakref.WeakKeyDictionary[nn.Module, dict[bool, tuple[Any, str | None]]] = (
    weakref.WeakKeyDictionary()
)


def lean_training_reason(model: nn.Module, *, require_sdpa: bool) -> str | None:
    """Why a training forward built on the lean pass cannot run ``model`` (None when it can):
    :func:`lean_unavailable_reason`, no global module hooks, and no attention dropout while
    the model trains. Used by the packed forward (``require_sdpa=False``) and the padded
    shared-prompt forward (``require_sdpa=True``, so the numbers are the module's).

    The walk over the modules is remembered per model until :func:`check_key` changes (new
    parameters, another attention implementation, or any hook registered anywhere, global
    ones included): it cost 0.5-0.7 ms per microbatch on a 2-layer model, a step of 45 ms
    asking twice. Removing a hook does not change the key, so a model refused for a hook
    stays on the module's own forward (slower, same numbers up to rounding) until its
    parameters change.
    """
    key = check_key(model)
    remembered = _CHECKED.setdefault(model, {})
    checked = remembered.get(require_sdpa)
    if checked is None or checked[0] != key:
        checked = (key, lean_unavailable_reason(model, require_sdpa=require_sdpa))
        remembered[require_sdpa] = checked
    if checked[1] is not None:
        return checked[1]
    if model.training and float(getattr(model.config, "attention_dropout", 0.0) or 0.0) > 0:
        return "attention dropout is on"
    return None


def check_key(model: nn.Module) -> tuple[Any, ...]:
    """What a remembered :func:`lean_unavailable_reason` of ``model`` depends on: its
    parameters (:func:`_layout_fingerprint`), its attention implementation, and the number of
    hooks registered in this process so far (torch numbers every hook handle it hands out, on
    any module or tensor, from one counter), so a hook added anywhere since the walk makes the
    next caller walk again."""
    return (
        _layout_fingerprint(model),
        getattr(model.config, "_attn_implementation", None),
        torch.utils.hooks.RemovableHandle.next_id,
    )


class LeanDecoder:
    """The forward pass of a Llama-family causal LM as plain tensor operations over the model's
    own parameters (see the module docstring); raises :class:`NotAvailableError` for a model
    :func:`lean_unavailable_reason` objects to."""

    def __init__(self, model: nn.Module) -> None:
        reason = lean_unavailable_reason(model)
        if reason is not None:
            raise NotAvailableError(f"the lean forward pass cannot run this model: {reason}")
        config = model.config
        base = model.model
        attn0 = base.layers[0].self_attn
        # Weakly: a cache keyed by the model (areno_core.train.lean_prefix) must not keep it alive.
        self._model = weakref.ref(model)
        self.eps = float(config.rms_norm_eps)
        self.head_dim = int(attn0.head_dim)
        self.n_rep = int(config.num_attention_heads) // int(config.num_key_value_heads)
        self.scaling = float(attn0.scaling)
        self.embed = base.embed_tokens.weight
        self.padding_idx = base.embed_tokens.padding_idx
        self.final_norm = base.norm.weight
        self.rotary = base.rotary_emb
        self.fingerprint = _layout_fingerprint(model)
        self.lm_head = _linear(model.lm_head)
        self.layers: list[_Layer] = []
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            q_norm = getattr(attn, "q_norm", None)
            k_norm = getattr(attn, "k_norm", None)
            self.layers.append(
                _Layer(
                    input_norm=layer.input_layernorm.weight,
                    post_norm=layer.post_attention_layernorm.weight,
                    q_norm=None if q_norm is None else q_norm.weight,
                    k_norm=None if k_norm is None else k_norm.weight,
                    q=_linear(attn.q_proj),
                    k=_linear(attn.k_proj),
                    v=_linear(attn.v_proj),
                    o=_linear(attn.o_proj),
                    gate=_linear(mlp.gate_proj),
                    up=_linear(mlp.up_proj),
                    down=_linear(mlp.down_proj),
                )
            )

    def _linears(self) -> list[_Linear]:
        return [self.lm_head, *(getattr(layer, n) for layer in self.layers for n in _LAYER_LINEARS)]

    @contextlib.contextmanager
    def prepacked(self, rows: int) -> Iterator[int]:
        """Run the block's no-grad forward passes on copies of the linear weights reordered
        once into oneDNN's own layout (``torch.ops.mkldnn._reorder_linear_weight``, what
        torch's compiler does for frozen bfloat16 models), rather than oneDNN multiplying by
        the plain weights. The products give the same numbers; in bfloat16 on an AVX512-BF16
        CPU they took 11-13% less time at 32 rows and 23-32% less at 8
        (docs/performance.md). ``rows`` is the batch the layout is chosen for (any batch
        runs). The copies are made from the weights as they are on entry, so nothing may
        change the weights inside the block, and they are dropped on exit; yields their size
        in bytes (held while in the block)."""
        linears = self._linears()
        try:
            size = 0
            for linear in linears:
                linear.packed = torch.ops.mkldnn._reorder_linear_weight(
                    linear.weight.detach(), max(1, rows)
                )
                size += linear.packed.numel() * linear.packed.element_size()
            yield size
        finally:
            for linear in linears:
                linear.packed = None

    def is_current(self, model: nn.Module) -> bool:
        """Whether this decoder still reads ``model``'s parameters (False after a device or
        dtype move, which replaces them; in-place optimizer steps keep it current)."""
        return model is self._model() and _layout_fingerprint(model) == self.fingerprint

    # -- the forward pass --------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        write_kv: KVWriter,
        attend: Attender | None = None,
    ) -> torch.Tensor:
        """Logits [B, V] of the last position of each row.

        ``input_ids`` / ``position_ids`` are [B, T]; ``mask`` is None (causal, every key
        visible) or a boolean [B, 1, T, K] mask over what ``write_kv`` returns. ``attend``,
        when given, stores the keys/values and computes attention instead of ``write_kv`` and
        :func:`sdpa` (the rollout engine's shared-prompt decode step).
        """
        # Normalise every position, then keep the last one (the order transformers uses).
        hidden = self.hidden_states(input_ids, position_ids, mask, write_kv, attend)
        logits = self.lm_head(hidden[:, -1:, :])
        return logits[:, -1, :].float()

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        write_kv: KVWriter,
        attend: Attender | None = None,
    ) -> torch.Tensor:
        """The final-norm hidden states [B, T, hidden] of every position (what the module's
        ``lm_head`` reads), with the arguments of :meth:`forward`; records gradients when
        they are on (the training forward of :mod:`areno_core.train.lean_prefix`)."""
        hidden = F.embedding(input_ids, self.embed, self.padding_idx)
        rotary = rotary_tables(*self.rotary(hidden, position_ids))
        for index, layer in enumerate(self.layers):
            hidden = self._layer(index, layer, hidden, rotary, mask, write_kv, attend)
        return rms_norm(hidden, self.final_norm, self.eps)

    def _layer(
        self,
        index: int,
        layer: _Layer,
        hidden: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
        write_kv: KVWriter,
        attend: Attender | None,
    ) -> torch.Tensor:
        batch, length = hidden.shape[:2]
        shape = (batch, length, -1, self.head_dim)
        x = rms_norm(hidden, layer.input_norm, self.eps)
        q, k, v = layer.q(x).view(shape), layer.k(x).view(shape), layer.v(x).view(shape)
        if layer.q_norm is not None:
            q = rms_norm(q, layer.q_norm, self.eps)
        if layer.k_norm is not None:
            k = rms_norm(k, layer.k_norm, self.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rotary_tables(q, k, *rotary)
        if attend is not None:
            attended = attend(index, q, k, v)
        else:
            k, v = write_kv(index, k, v)
            attended = sdpa(q, k, v, mask, self.n_rep, self.scaling)
        hidden = hidden + layer.o(attended.reshape(batch, length, -1).contiguous())
        x = rms_norm(hidden, layer.post_norm, self.eps)
        return hidden + layer.down(F.silu(layer.gate(x)) * layer.up(x))


__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "Attender",
    "KVWriter",
    "LeanDecoder",
    "apply_rotary",
    "apply_rotary_tables",
    "lean_training_reason",
    "lean_unavailable_reason",
    "prepack_unavailable_reason",
    "rms_norm",
    "rotary_tables",
    "sdpa",
]
