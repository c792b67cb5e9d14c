"""Sharding a model over the device mesh: tensor-parallel plans and FSDP2.

``shard_module`` first splits the decoder layers over the ``tp`` mesh dimension (when
``--tp-size`` > 1) and then shards every parameter over the ``dp`` dimension with FSDP2's
``fully_shard`` (each decoder layer is one unit, the rest of the model the root unit):

* attention: the query, key and value projections are split by output features (column
  parallel: each tp rank computes a subset of the heads) and the output projection by input
  features (row parallel: the partial outputs are summed across the tp ranks). Per-head norms
  (Qwen3's and Gemma 3's ``q_norm``/``k_norm``) keep their weights whole on every tp rank
  and see that rank's heads; their gradients are summed across the tp ranks;
* MLP: the gate and up projections column parallel, the down projection row parallel.

Embeddings, norms and the output layer are not split by tp (only sharded by FSDP). A
projection that carries a LoRA adapter (PEFT's ``lora.Linear``) is split through its base
layer and the adapter half that splits the same way (see :func:`_linear_plan`). Plans exist
for the model families in :data:`TP_FAMILIES`; other families train with ``--tp-size 1``.

Gradients of the data-parallel ranks are *summed* (not averaged): each rank's loss is already
divided by the token and row counts of the whole global batch, so the sum is the gradient of
the global loss, exactly as in one process.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from areno_core.errors import ConfigError
from areno_core.train.distributed.context import DistContext

# Model families (``config.model_type``) with a tensor-parallel plan; all share the layout
# layers[i].self_attn.{q,k,v,o}_proj and layers[i].mlp.{gate,up,down}_proj (Gemma 3, like
# Qwen3, with per-head q_norm/k_norm). Not here: fused projections (Phi-3), norms over all
# heads at once (OLMo 2) and mixtures of experts (Qwen3-MoE, GPT-OSS).
TP_FAMILIES: tuple[str, ...] = ("qwen3", "qwen2", "llama", "mistral", "gemma2", "gemma3_text")
_COLUMN = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
)
_ROW = ("self_attn.o_proj", "mlp.down_proj")
_PER_HEAD = ("self_attn.q_norm", "self_attn.k_norm")  # input [batch, tokens, heads, head_dim]


def check_tp_support(config: Any, tp_size: int, *, what: str = "--ckpt") -> None:
    """Raise :class:`ConfigError` unless a model with this Hugging Face ``config`` can be split
    ``tp_size`` ways (a family with a plan, head and feature counts divisible by it)."""
    if tp_size == 1:
        return
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    family = getattr(text, "model_type", None)
    if family not in TP_FAMILIES:
        raise ConfigError(
            f"--tp-size {tp_size}: {what} is a {family or 'unknown'!s} model; tensor-parallel "
            f"plans exist for {', '.join(TP_FAMILIES)}. Use --tp-size 1 (data parallel only)"
        )
    counts = {
        "num_attention_heads": getattr(text, "num_attention_heads", None),
        "num_key_value_heads": getattr(text, "num_key_value_heads", None)
        or getattr(text, "num_attention_heads", None),
        "intermediate_size": getattr(text, "intermediate_size", None),
    }
    for name, value in counts.items():
        if value is None or value % tp_size:
            raise ConfigError(
                f"--tp-size {tp_size}: {what} has {name}={value}, which does not split into "
                f"{tp_size} equal parts; pick a --tp-size that divides it"
            )


def decoder_layers(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a causal LM or a value model (the ``layers`` list)."""
    for name, child in module.named_modules():
        if name.split(".")[-1] == "layers" and isinstance(child, nn.ModuleList):
            return list(child)
    raise ConfigError(f"{type(module).__name__} has no 'layers' list of transformer blocks")


def shard_module(module: nn.Module, ctx: DistContext, *, mixed_precision: bool) -> nn.Module:
    """Split ``module`` over ``ctx``'s mesh in place (see the module docstring); returns it."""
    from torch.distributed.fsdp import (  # heavy: distributed work only
        FSDPModule,
        MixedPrecisionPolicy,
        fully_shard,
    )

    # A value model returns a view of its head's output; areno never changes it in place
    # (values are padded into new tensors), which is what this warning is about.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDPValueModel\)")
    layers = decoder_layers(module)
    if ctx.tp_size > 1:
        check_tp_support(module.config, ctx.tp_size, what=type(module).__name__)
        frozen = {name for name, p in module.named_parameters() if not p.requires_grad}
        _apply_tp(layers, ctx)
        # Some plans make new parameters that require grad; frozen weights (a LoRA policy's
        # base) stay frozen.
        for name, param in module.named_parameters():
            if name in frozen:
                param.requires_grad_(False)
    policy = None
    dtype = next(module.parameters()).dtype
    if mixed_precision and ctx.device.type == "cuda" and dtype == torch.float32:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kwargs: dict[str, Any] = {"mesh": ctx.dp_mesh}
    if policy is not None:
        kwargs["mp_policy"] = policy
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(module, **kwargs)
    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            # Sum, do not average: the losses are already normalised by global counts. A plain
            # SUM also works on gloo, which has no pre-multiplied or averaging reductions.
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
    return module


def _apply_tp(layers: Sequence[nn.Module], ctx: DistContext) -> None:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )  # heavy: distributed work only

    for layer in layers:
        modules = dict(layer.named_modules())
        names = set(modules)
        plan: dict[str, Any] = {}
        for name in _COLUMN:
            plan.update(_linear_plan(name, modules.get(name), ColwiseParallel, column=True))
        for name in _ROW:
            plan.update(_linear_plan(name, modules.get(name), RowwiseParallel, column=False))
        # Sharded along the heads dimension: the weight is replicated, its gradient summed.
        plan.update(
            {
                name: SequenceParallel(sequence_dim=2, use_local_output=True)
                for name in _PER_HEAD
                if name in names
            }
        )
        missing = sorted(set(plan) - names)
        if missing:
            raise ConfigError(
                f"{type(layer).__name__} has no {', '.join(missing)}; its tensor-parallel plan "
                "does not fit this model"
            )
        parallelize_module(layer, ctx.tp_mesh, plan)


def _linear_plan(
    name: str, module: nn.Module | None, style: Any, *, column: bool
) -> dict[str, Any]:
    """The plan of one projection: ``style`` on it, or, when PEFT put a LoRA layer there, on
    its base ``nn.Linear`` and on the adapter half that splits the same way.

    Column parallel (output features split): ``lora_B`` is split like the base and ``lora_A``
    stays whole, so each tp rank adds its slice of the adapter's output to its slice of the
    base output. Row parallel (input features split): ``lora_A`` is split like the base (its
    partial outputs are summed across the tp ranks) and ``lora_B`` stays whole, so every rank
    adds the full adapter output to the full base output. The whole halves get the same
    gradient on every tp rank."""
    adapters = getattr(module, "lora_A", None)
    if module is None or adapters is None:
        return {name: style()}
    half = "lora_B" if column else "lora_A"
    plan = {f"{name}.base_layer": style()}
    plan.update({f"{name}.{half}.{adapter}": style() for adapter in adapters})
    return plan


@torch.no_grad()
def clip_sharded_grad_norm(params: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip the global L2 norm of (possibly sharded) gradients to ``max_norm`` like
    ``torch.nn.utils.clip_grad_norm_``; returns the norm before clipping, the same on every
    rank. Gradients on different meshes (tensor-parallel layers, FSDP-only parameters) are
    reduced per mesh, then combined."""
    from torch.distributed.tensor import (
        DTensor,  # heavy: distributed work only
    )

    groups: dict[Any, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            key = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
            groups.setdefault(key, []).append(p.grad)
    if not groups:
        return torch.zeros(())
    norms = []
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))
    coef = float(torch.clamp(max_norm / (total + 1e-6), max=1.0))
    for grads in groups.values():
        torch._foreach_mul_(grads, coef)
    return total


@torch.no_grad()
def copy_full_weights(source: nn.Module, target: nn.Module) -> None:
    """Copy the full (gathered) weights of a sharded ``source`` into the plain ``target`` of
    the same architecture. A collective: every rank of the mesh must call it."""
    from torch.distributed.tensor import (
        DTensor,  # heavy: distributed work only
    )

    dest = target.state_dict()
    gathered: dict[int, torch.Tensor] = {}
    for key, value in source.state_dict().items():
        if key not in dest:
            raise KeyError(f"{key} is not a weight of the rollout model")
        full = gathered.get(id(value))
        if full is None:
            full = value.full_tensor() if isinstance(value, DTensor) else value
            gathered[id(value)] = full
        dest[key].copy_(full)
