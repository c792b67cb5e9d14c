"""A lean forward pass for Llama-family decoders (Qwen3, Qwen2, Llama).

A transformers model spends a few milliseconds per call outside its kernels on a CPU: the
module tree, mask construction, output wrappers. For a decode step of a small model, or any
step of a tiny one, that overhead is most of the time. :class:`LeanDecoder` reads the weights
of such a model and runs the same computation as a plain sequence of tensor operations:

* with ``compute_dtype=None`` it reuses the module's own parameters and issues the same
  operations in the same order as the transformers code with SDPA attention (the same masks
  and the same grouped-query path), so on the same machine it returns bit-identical results;
* with ``compute_dtype=torch.bfloat16`` it keeps its own bfloat16 copy of the projection
  weights (query/key/value and gate/up fused into one matrix each) and runs only the
  matrix products and attention in bfloat16; norms, rotary embeddings, the residual stream and
  logits stay float32. The copy is rebuilt when the module's parameters change (see
  :meth:`LeanDecoder.is_current`).

Only inference uses it (the rollout engine); see :func:`lean_unavailable_reason` for what a
model must look like.
"""

from __future__ import annotations

from collections.abc import Callable
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


def lean_unavailable_reason(model: nn.Module, *, require_sdpa: bool = True) -> str | None:
    """Why :class:`LeanDecoder` cannot run ``model`` (None when it can).

    It needs a transformers ``Qwen3ForCausalLM``, ``Qwen2ForCausalLM`` or ``LlamaForCausalLM``
    with SiLU MLPs, full attention in every layer, plain ``nn.Linear`` / ``nn.Embedding``
    modules (no adapters or quantized layers) and no forward hooks. ``require_sdpa``: the
    model must also be set to SDPA attention (the lean pass always uses SDPA, so only then
    does it give the module's own numbers).
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
    if getattr(model.model, "gradient_checkpointing", False):
        return "activation checkpointing is on"
    if torch.nn.modules.module._global_forward_hooks or (
        torch.nn.modules.module._global_forward_pre_hooks
    ):
        return "global module hooks are registered"
    for name, module in model.named_modules():
        if module._forward_hooks or module._forward_pre_hooks:
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
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of ``q``/``k`` [B, H, T, D] with ``cos``/``sin`` [B, T, D]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos) + (_rotate_half(q) * sin), (k * cos) + (_rotate_half(k) * sin)


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
    """
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


@attrs.frozen
class _Linear:
    weight: torch.Tensor
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


@attrs.frozen
class _Layer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    # Either q, k, v separately (the module's own parameters) or one fused qkv.
    q: _Linear | None
    k: _Linear | None
    v: _Linear | None
    qkv: _Linear | None
    o: _Linear
    gate: _Linear | None
    up: _Linear | None
    gate_up: _Linear | None
    down: _Linear


def _linear(module: nn.Linear) -> _Linear:
    return _Linear(module.weight, module.bias)


def _fused(modules: list[nn.Linear], dtype: torch.dtype) -> _Linear:
    weight = torch.cat([m.weight.detach() for m in modules]).to(dtype).contiguous()
    biases = [m.bias for m in modules]
    if all(b is None for b in biases):
        return _Linear(weight, None)
    parts = [
        b.detach() if b is not None else m.weight.new_zeros(m.out_features)
        for m, b in zip(modules, biases, strict=True)
    ]
    return _Linear(weight, torch.cat(parts).to(dtype))


def _cast(module: nn.Linear, dtype: torch.dtype) -> _Linear:
    bias = None if module.bias is None else module.bias.detach().to(dtype)
    return _Linear(module.weight.detach().to(dtype).contiguous(), bias)


def parameter_fingerprint(model: nn.Module) -> tuple[tuple[int, int, int], ...]:
    """Identity, storage and in-place version of every parameter: changes whenever an
    optimizer step, ``load_state_dict`` or a device move touches the weights."""
    return tuple((id(p), p.data_ptr(), p._version) for p in model.parameters())


class LeanDecoder:
    """The forward pass of a Llama-family causal LM as plain tensor operations (see the module
    docstring). Build it with :meth:`from_model`; it holds references to (or, for another
    ``compute_dtype``, copies of) the model's weights."""

    def __init__(self, model: nn.Module, compute_dtype: torch.dtype | None = None) -> None:
        reason = lean_unavailable_reason(model, require_sdpa=compute_dtype is None)
        if reason is not None:
            raise NotAvailableError(f"the lean forward pass cannot run this model: {reason}")
        config = model.config
        base = model.model
        attn0 = base.layers[0].self_attn
        self.model = model
        self.compute_dtype = compute_dtype
        self.eps = float(config.rms_norm_eps)
        self.head_dim = int(attn0.head_dim)
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(config.num_key_value_heads)
        self.n_rep = self.num_heads // self.num_kv_heads
        self.scaling = float(attn0.scaling)
        self.embed = base.embed_tokens.weight
        self.padding_idx = base.embed_tokens.padding_idx
        self.final_norm = base.norm.weight
        self.rotary = base.rotary_emb
        self.fingerprint = parameter_fingerprint(model)
        cast = compute_dtype is not None
        head = model.lm_head
        self.lm_head = _cast(head, compute_dtype) if cast else _linear(head)  # type: ignore[arg-type]
        self.layers: list[_Layer] = []
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            q_norm = getattr(attn, "q_norm", None)
            k_norm = getattr(attn, "k_norm", None)
            if cast:
                assert compute_dtype is not None
                qkv = _fused([attn.q_proj, attn.k_proj, attn.v_proj], compute_dtype)
                gate_up = _fused([mlp.gate_proj, mlp.up_proj], compute_dtype)
                parts: dict[str, Any] = {
                    "q": None,
                    "k": None,
                    "v": None,
                    "qkv": qkv,
                    "o": _cast(attn.o_proj, compute_dtype),
                    "gate": None,
                    "up": None,
                    "gate_up": gate_up,
                    "down": _cast(mlp.down_proj, compute_dtype),
                }
            else:
                parts = {
                    "q": _linear(attn.q_proj),
                    "k": _linear(attn.k_proj),
                    "v": _linear(attn.v_proj),
                    "qkv": None,
                    "o": _linear(attn.o_proj),
                    "gate": _linear(mlp.gate_proj),
                    "up": _linear(mlp.up_proj),
                    "gate_up": None,
                    "down": _linear(mlp.down_proj),
                }
            self.layers.append(
                _Layer(
                    input_norm=layer.input_layernorm.weight,
                    post_norm=layer.post_attention_layernorm.weight,
                    q_norm=None if q_norm is None else q_norm.weight,
                    k_norm=None if k_norm is None else k_norm.weight,
                    **parts,
                )
            )

    @classmethod
    def from_model(
        cls, model: nn.Module, compute_dtype: torch.dtype | None = None
    ) -> LeanDecoder | None:
        """A decoder for ``model``, or None when :func:`lean_unavailable_reason` objects."""
        if lean_unavailable_reason(model, require_sdpa=compute_dtype is None) is not None:
            return None
        return cls(model, compute_dtype)

    def is_current(self, model: nn.Module) -> bool:
        """Whether this decoder still describes ``model``'s weights (a copy goes stale when the
        parameters change; references never do, but a new module layout needs a new decoder)."""
        return model is self.model and parameter_fingerprint(model) == self.fingerprint

    @property
    def kv_dtype(self) -> torch.dtype:
        """The dtype of the keys and values handed to the :data:`KVWriter`."""
        return self.compute_dtype or self.embed.dtype

    # -- the forward pass --------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        write_kv: KVWriter,
    ) -> torch.Tensor:
        """Logits [B, V] of the last position of each row.

        ``input_ids`` / ``position_ids`` are [B, T]; ``mask`` is None (causal, every key
        visible) or a boolean [B, 1, T, K] mask over what ``write_kv`` returns.
        """
        hidden = F.embedding(input_ids, self.embed, self.padding_idx)
        cos, sin = self.rotary(hidden, position_ids)
        for index, layer in enumerate(self.layers):
            hidden = self._layer(index, layer, hidden, cos, sin, mask, write_kv)
        # Normalise every position, then keep the last one (the order transformers uses).
        hidden = rms_norm(hidden, self.final_norm, self.eps)
        logits = self._project(self.lm_head, hidden[:, -1:, :])
        return logits[:, -1, :].float()

    def _project(self, linear: _Linear, x: torch.Tensor) -> torch.Tensor:
        if self.compute_dtype is None:
            return linear(x)
        return linear(x.to(self.compute_dtype))

    def _layer(
        self,
        index: int,
        layer: _Layer,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        write_kv: KVWriter,
    ) -> torch.Tensor:
        batch, length = hidden.shape[:2]
        shape = (batch, length, -1, self.head_dim)
        x = rms_norm(hidden, layer.input_norm, self.eps)
        if layer.qkv is None:
            assert layer.q is not None and layer.k is not None and layer.v is not None
            q, k, v = layer.q(x).view(shape), layer.k(x).view(shape), layer.v(x).view(shape)
        else:
            q_size = self.num_heads * self.head_dim
            kv_size = self.num_kv_heads * self.head_dim
            fused = self._project(layer.qkv, x).float()
            q, k, v = fused.split([q_size, kv_size, kv_size], dim=-1)
            q, k, v = q.reshape(shape), k.reshape(shape), v.reshape(shape)
        if layer.q_norm is not None:
            q = rms_norm(q, layer.q_norm, self.eps)
        if layer.k_norm is not None:
            k = rms_norm(k, layer.k_norm, self.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        if self.compute_dtype is not None:
            q, k, v = (t.to(self.compute_dtype) for t in (q, k, v))
        k, v = write_kv(index, k, v)
        attended = sdpa(q, k, v, mask, self.n_rep, self.scaling)
        attended = attended.reshape(batch, length, -1).contiguous()
        out = self._project(layer.o, attended)
        hidden = hidden + (out if self.compute_dtype is None else out.float())

        x = rms_norm(hidden, layer.post_norm, self.eps)
        if layer.gate_up is None:
            assert layer.gate is not None and layer.up is not None
            act = F.silu(layer.gate(x)) * layer.up(x)
        else:
            gate, up = self._project(layer.gate_up, x).chunk(2, dim=-1)
            act = F.silu(gate) * up
        out = self._project(layer.down, act)
        return hidden + (out if self.compute_dtype is None else out.float())


__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "KVWriter",
    "LeanDecoder",
    "apply_rotary",
    "lean_unavailable_reason",
    "parameter_fingerprint",
    "rms_norm",
    "sdpa",
]
