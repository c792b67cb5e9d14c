"""Per-device memory of a training setup, predicted from the model's shape.

Every figure is bytes on one device (one GPU, or one process on a CPU), for the way areno
trains (see docs/plan.md for each formula and how close it came to measurements):

* one process (``--world-size 1``): the policy in its dtype; in a 16-bit dtype float32
  master weights beside it; float32 gradients; AdamW's two float32 moments;
* several processes: float32 parameters, gradients and moments sharded by FSDP2 over the
  ``--world-size / (--tp-size x --dp-replicate)`` ranks of a shard group, the decoder
  layers' projections also split ``--tp-size`` ways; on a GPU the passes run in bfloat16
  (FSDP2 mixed precision), so activations are 2 bytes wide; a full float32 copy of the
  policy per process for rollouts (online algorithms).

Activations are those transformers' Qwen/Llama decoder layers keep for the backward pass
(SDPA or flash-attn: no attention matrix), counted tensor by tensor, plus the float32
log-probabilities of every vocabulary entry that the loss keeps; with activation
checkpointing each layer keeps only its input, and one layer's activations exist again
while its backward pass runs, with about as much again in the gradients flowing through it.
"""

from __future__ import annotations

import math

import attrs

from areno_core.errors import ConfigError
from areno_core.plan.shapes import ModelShape

MIB = 1024 * 1024
GIB = 1024 * MIB
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The families areno_core.train.distributed.parallelize splits with --tp-size (kept here so
# that planning imports no torch.distributed).
TP_FAMILIES = ("qwen3", "qwen2", "llama", "mistral", "gemma2", "gemma3_text")


@attrs.frozen
class Setup:
    """What is trained, where, and with which sizes (one micro-batch of ``micro_batch`` rows
    of ``seq_len`` tokens; rollouts of ``rollout_rows`` sequences of ``rollout_len`` tokens)."""

    shape: ModelShape
    seq_len: int
    micro_batch: int = 1
    dtype: str = "bfloat16"
    device: str = "cuda"
    world_size: int = 1
    tp_size: int = 1
    dp_replicate: int = 1
    lora_rank: int | None = None
    reference: bool = False
    critic: bool = False
    rollout: bool = False
    rollout_rows: int = 0
    rollout_len: int = 0
    mixed_precision: bool = True

    def __attrs_post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"--dtype {self.dtype}: expected one of {', '.join(DTYPE_BYTES)}")
        flags = {
            "seq_len": "the row length (--max-prompt-tokens + --max-new-tokens)",
            "micro_batch": "--mini-bs",
            "world_size": "--world-size",
            "tp_size": "--tp-size",
            "dp_replicate": "--dp-replicate",
        }
        for name, flag in flags.items():
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag} must be at least 1, got {getattr(self, name)}")
        if self.tp_size > 1 and self.shape.family not in TP_FAMILIES:
            raise ConfigError(
                f"--tp-size {self.tp_size}: areno has tensor-parallel plans for "
                f"{', '.join(TP_FAMILIES)}, not {self.shape.family} models"
            )
        if self.world_size % self.tp_size:
            raise ConfigError(
                f"--world-size {self.world_size} is not divisible by --tp-size {self.tp_size}"
            )
        if (self.world_size // self.tp_size) % self.dp_replicate:
            raise ConfigError(
                f"--dp-replicate {self.dp_replicate} does not divide the "
                f"{self.world_size // self.tp_size} data-parallel ranks"
            )
        if self.lora_rank is not None and self.lora_rank < 1:
            raise ConfigError(f"--lora-rank must be at least 1, got {self.lora_rank}")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def shard(self) -> int:
        """Ranks one FSDP2 shard group splits the parameters over."""
        return self.world_size // (self.tp_size * self.dp_replicate)

    @property
    def weight_bytes(self) -> int:
        """Bytes per stored parameter: float32 under FSDP2, else the run's dtype."""
        return 4 if self.distributed else DTYPE_BYTES[self.dtype]

    @property
    def compute_bytes(self) -> int:
        """Bytes per activation element."""
        if self.distributed:
            return 2 if self.device == "cuda" and self.mixed_precision else 4
        return DTYPE_BYTES[self.dtype]


@attrs.frozen
class Item:
    name: str
    bytes: int
    note: str


@attrs.frozen
class Plan:
    setup: Setup
    items: tuple[Item, ...]
    activation_items: tuple[Item, ...]
    rollout_items: tuple[Item, ...]

    def total(self, *, checkpointing: bool, rollout_state: bool = False) -> int:
        """Peak of a training step: the resident state plus the micro-batch's activations
        (plus the rollout state when it is kept through the update)."""
        act = self.activation(checkpointing)
        rollout = sum(i.bytes for i in self.rollout_items) if rollout_state else 0
        return sum(i.bytes for i in self.items) + act + rollout

    def activation(self, checkpointing: bool) -> int:
        name = "activations, checkpointed" if checkpointing else "activations"
        return next(i.bytes for i in self.activation_items if i.name == name)

    def rollout_total(self) -> int:
        """Peak while rolling out: resident state plus replica and KV cache (no gradients:
        they are freed after each optimizer step)."""
        resident = sum(i.bytes for i in self.items if i.name != "gradients")
        return resident + sum(i.bytes for i in self.rollout_items)


def _per_device_params(setup: Setup, params: int, split: int) -> float:
    """Stored parameters per device of a model with ``params`` parameters of which ``split``
    are split by tensor parallelism; FSDP2 shards everything over the shard group."""
    if not setup.distributed:
        return float(params)
    return (split / setup.tp_size + (params - split)) / setup.shard


def layer_activation_bytes(shape: ModelShape, a: int, tp: int = 1) -> float:
    """Bytes one decoder layer keeps for backward per token (``a`` bytes per element).

    RMSNorm (transformers computes it in float32) keeps its float32 input, its normalised
    value and its output: ``(4 + 2a)`` bytes per feature (the float32 input is the input
    itself in a float32 model); queries and keys the same again when the model normalises
    them per head (Qwen3), else only their rotated form; values; attention's output twice
    (the kernel's and the output projection's contiguous input) and its float32
    log-sum-exp per head; SwiGLU's gate, its activation, up and their product."""
    norms = 2 * (4 + 2 * a) * shape.hidden
    qk_width = shape.q_width + shape.kv_width
    qk = (4 + 2 * a) * qk_width if shape.qk_norm else a * qk_width
    attention = qk + a * shape.kv_width + 2 * a * shape.q_width + 4 * shape.heads
    if shape.experts:
        k = shape.experts_per_token
        # router logits and their float32 softmax; each chosen expert's input copy and SwiGLU
        mlp = (a + 4) * shape.experts + k * (a * shape.hidden + 4 * a * shape.expert_intermediate)
    else:
        mlp = 4 * a * shape.intermediate
    return norms + (attention + mlp) / tp


def estimate(setup: Setup) -> Plan:
    """The memory plan of ``setup`` (see the module docstring)."""
    shape = setup.shape
    total = shape.total_params()
    split = shape.tp_split_params()
    stored = _per_device_params(setup, total, split)
    wb = setup.weight_bytes
    a = setup.compute_bytes
    items: list[Item] = []
    where = f"{setup.dtype}, whole"
    if setup.distributed:
        where = f"float32, 1/{setup.shard} (FSDP2)"
        if setup.tp_size > 1:
            where += f" x 1/{setup.tp_size} of the layers (tp)"
    items.append(Item("weights", int(stored * wb), f"{total:,} parameters, {where}"))
    if setup.lora_rank is not None:
        trainable = shape.lora_params(setup.lora_rank) / (
            setup.tp_size * setup.shard if setup.distributed else 1
        )
        adapters = shape.lora_params(setup.lora_rank)
        what = f"LoRA rank {setup.lora_rank}: {adapters:,} adapter parameters"
        # the adapters are stored beside the frozen base
        items[0] = Item(
            "weights", int(stored * wb + trainable * wb), items[0].note + "; + adapters"
        )
    else:
        trainable = stored
        what = "every parameter"
    master = not setup.distributed and DTYPE_BYTES[setup.dtype] == 2
    if master:
        items.append(Item("master weights", int(trainable * 4), f"float32 copy of {what}"))
    items.append(Item("gradients", int(trainable * 4), f"float32, {what}"))
    items.append(Item("optimizer state", int(trainable * 8), f"AdamW moments, float32, {what}"))
    if setup.reference and setup.lora_rank is None:
        items.append(Item("reference model", int(stored * wb), "frozen copy of the policy"))
    if setup.critic:
        backbone = total - (0 if shape.tied else shape.vocab * shape.hidden) + shape.hidden + 1
        critic = _per_device_params(setup, backbone, split)
        per = wb + 4 + 8 + (4 if master else 0)
        items.append(
            Item(
                "critic",
                int(critic * per),
                f"{backbone:,} parameters: weights, gradients, AdamW state"
                + (", master weights" if master else ""),
            )
        )
    if setup.distributed and setup.shard > 1:
        layer = shape.layer_params() / setup.tp_size
        items.append(
            Item(
                "FSDP2 gathered layers",
                int(layer * (2 * a + 4)),
                f"two layers gathered in {a}-byte precision and one layer's float32 gradient "
                "before it is reduced",
            )
        )
    activation_items = _activations(setup)
    rollout_items: list[Item] = []
    if setup.rollout:
        if setup.distributed:
            rollout_items.append(
                Item("rollout replica", total * 4, "a whole float32 copy of the policy per process")
            )
        cache_bytes = 4 if setup.distributed else DTYPE_BYTES[setup.dtype]
        tokens = setup.rollout_rows * setup.rollout_len
        rollout_items.append(
            Item(
                "rollout KV cache",
                tokens * (shape.kv_bytes_per_token(cache_bytes) + 1),
                f"{setup.rollout_rows} sequences x {setup.rollout_len} tokens x "
                f"{shape.kv_bytes_per_token(cache_bytes):,} bytes of keys and values per token "
                "(+ 1 byte of mask)",
            )
        )
        if not setup.distributed and setup.device == "cpu" and setup.dtype == "bfloat16":
            rollout_items.append(
                Item(
                    "prepacked weights",
                    total * 2,
                    "at most: the native engine's linear weights reordered for oneDNN during "
                    "each generate() call, on CPUs with bfloat16 products "
                    "(--no-prepacked-weights: none)",
                )
            )
    return Plan(setup, tuple(items), activation_items, tuple(rollout_items))


def _activations(setup: Setup) -> tuple[Item, ...]:
    shape = setup.shape
    a = setup.compute_bytes
    tokens = setup.micro_batch * setup.seq_len
    per_layer = layer_activation_bytes(shape, a, setup.tp_size)
    head = (4 + 2 * a) * shape.hidden + _logits_bytes(shape, a)
    full = tokens * (shape.layers * per_layer + head)
    # one layer recomputed for its backward pass, and about as much again in the gradients
    # flowing through it (measured: docs/plan.md)
    checkpointed = tokens * (shape.layers * a * shape.hidden + 2 * per_layer + head)
    note = f"{setup.micro_batch} rows x {setup.seq_len} tokens, {a}-byte activations"
    return (
        Item("activations", int(full), note),
        Item("activations, checkpointed", int(checkpointed), note + ", checkpointed"),
    )


def _logits_bytes(shape: ModelShape, a: int) -> int:
    """Per token: the float32 log-softmax the loss keeps, plus, during its backward pass, its
    float32 gradient and the gradient of the output layer's ``a``-byte logits."""
    return shape.vocab * (4 + 4 + a)


def largest_micro_batch(
    setup: Setup, budget_bytes: int, *, checkpointing: bool, rollout_state: bool = False
) -> int:
    """The most rows per micro-batch whose training step fits ``budget_bytes`` (0: none)."""
    base = estimate(attrs.evolve(setup, micro_batch=1))
    fixed = base.total(checkpointing=checkpointing, rollout_state=rollout_state)
    per_row = base.activation(checkpointing)
    resident = fixed - per_row
    if resident + per_row > budget_bytes:
        return 0
    return max(0, math.floor((budget_bytes - resident) / per_row))
