"""``areno plan``: how much memory a training setup needs on each GPU, before renting one.

    areno plan --ckpt Qwen/Qwen3-8B --algo grpo --world-size 8 --gpu-mem 80
    areno plan --layers 36 --hidden 4096 --heads 32 --kv-heads 8 --intermediate 12288 \\
        --vocab 151936 --algo dpo --lora-rank 16

Nothing is loaded: the model's shape comes from a published config areno ships, a
``random:`` reference, a local checkpoint's ``config.json``, or the size flags.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import click
from rich.console import Console
from rich.table import Table

from areno_core.config import default_of
from areno_core.errors import ConfigError
from areno_core.plan.estimate import GIB, Plan, Setup, estimate, largest_micro_batch
from areno_core.plan.shapes import ModelShape, resolve_shape
from areno_core.registry import get_registry

console = Console()

SIZE_FLAGS = {
    "layers": "layers",
    "hidden": "hidden",
    "heads": "heads",
    "kv_heads": "kv_heads",
    "head_dim": "head_dim",
    "intermediate": "intermediate",
    "vocab": "vocab",
    "experts": "experts",
    "experts_per_token": "experts_per_token",
    "expert_intermediate": "expert_intermediate",
}


def model_shape(
    ckpt: str | None, sizes: dict[str, Any], tied: bool | None, family: str
) -> ModelShape:
    """The shape from ``--ckpt`` with any size flags on top, or from the size flags alone."""
    given = {k: v for k, v in sizes.items() if v is not None}
    if ckpt is not None:
        shape = resolve_shape(ckpt)
        changes = dict(given)
        if tied is not None:
            changes["tied"] = tied
        return attrs.evolve(shape, **changes) if changes else shape
    required = ("layers", "hidden", "heads", "intermediate", "vocab")
    missing = [f"--{n.replace('_', '-')}" for n in required if n not in given]
    if missing and not given.get("experts"):
        raise ConfigError(
            f"give --ckpt (a published model id, random:..., or a local checkpoint) or the "
            f"model's sizes; missing {', '.join(missing)}"
        )
    given.setdefault("kv_heads", given["heads"])
    given.setdefault("head_dim", given["hidden"] // given["heads"])
    given.setdefault("intermediate", 0)
    return ModelShape(
        **given,
        tied=bool(tied),
        qk_norm=family.startswith("qwen3"),
        qkv_bias=family == "qwen2",
        family=family,
    )


def algorithm_roles(algo: str) -> tuple[bool, bool, bool]:
    """(reference, critic, rollout) of an installed algorithm with its default options."""
    spec = get_registry().algorithm(algo)
    reference = spec.uses_reference(spec.make_config({}))
    return reference, "critic" in spec.roles, spec.needs_rollout


def plan_report(plan: Plan, *, gpu_gib: float, mem_frac: float) -> dict[str, Any]:
    """The machine-readable plan (``--json``): every item, totals and the micro-batch limits."""
    setup = plan.setup
    budget = int(gpu_gib * GIB * mem_frac)
    out: dict[str, Any] = {
        "model": setup.shape.name,
        "parameters": setup.shape.total_params(),
        "setup": {k: v for k, v in attrs.asdict(setup).items() if k != "shape"},
        "per_device_gib": {i.name: i.bytes / GIB for i in plan.items},
        "activations_gib": {i.name: i.bytes / GIB for i in plan.activation_items},
        "rollout_gib": {i.name: i.bytes / GIB for i in plan.rollout_items},
        "budget_gib": budget / GIB,
    }
    for ckpt in (True, False):
        key = "checkpointed" if ckpt else "not_checkpointed"
        out[f"train_step_gib_{key}"] = plan.total(checkpointing=ckpt) / GIB
        out[f"largest_micro_batch_{key}"] = largest_micro_batch(setup, budget, checkpointing=ckpt)
    if setup.rollout:
        out["rollout_phase_gib"] = plan.rollout_total() / GIB
    return out


@click.command("plan")
@click.option(
    "--ckpt",
    default=None,
    help="Published hub id (e.g. Qwen/Qwen3-8B), random:..., or a local checkpoint or config.json.",
)
@click.option("--layers", type=int, default=None, help="Decoder layers.")
@click.option("--hidden", type=int, default=None, help="Hidden size.")
@click.option("--heads", type=int, default=None, help="Attention heads.")
@click.option("--kv-heads", type=int, default=None, help="Key/value heads (default: --heads).")
@click.option("--head-dim", type=int, default=None, help="Per-head size (default: hidden / heads).")
@click.option("--intermediate", type=int, default=None, help="MLP intermediate size.")
@click.option("--vocab", type=int, default=None, help="Vocabulary size.")
@click.option("--tied/--untied", default=None, help="Output layer tied to the input embeddings.")
@click.option("--experts", type=int, default=None, help="MoE experts per layer (0: dense).")
@click.option("--experts-per-token", type=int, default=None, help="MoE experts each token uses.")
@click.option("--expert-intermediate", type=int, default=None, help="MoE expert MLP size.")
@click.option(
    "--family",
    type=click.Choice(["qwen3", "qwen2", "llama"]),
    default="qwen3",
    show_default=True,
    help="Layer layout of a model given by sizes.",
)
@click.option(
    "--algo",
    default=default_of("algo"),
    show_default=True,
    help="Algorithm (its reference/critic roles and rollouts).",
)
@click.option(
    "--dtype",
    type=click.Choice(["auto", "bfloat16", "float32", "float16"]),
    default="auto",
    show_default=True,
    help="Model dtype; auto: bfloat16 on a GPU, float32 on a CPU.",
)
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True)
@click.option("--world-size", type=int, default=1, show_default=True)
@click.option("--tp-size", type=int, default=1, show_default=True)
@click.option(
    "--dp-replicate", type=int, default=1, show_default=True, help="Hybrid sharding groups."
)
@click.option("--fsdp-mixed-precision/--no-fsdp-mixed-precision", default=True, show_default=True)
@click.option("--lora-rank", type=int, default=None, help="Train LoRA adapters of this rank.")
@click.option("--mini-bs", type=int, default=1, show_default=True, help="Rows per micro-batch.")
@click.option(
    "--max-prompt-tokens", type=int, default=default_of("max_prompt_tokens"), show_default=True
)
@click.option("--max-new-tokens", type=int, default=default_of("max_new_tokens"), show_default=True)
@click.option(
    "--max-running-prompts",
    type=int,
    default=None,
    help="Sequences decoded at once (default: --batch-size x --n-samples).",
)
@click.option("--batch-size", type=int, default=default_of("batch_size"), show_default=True)
@click.option("--n-samples", type=int, default=default_of("n_samples"), show_default=True)
@click.option(
    "--gpu-mem", type=float, default=80.0, show_default=True, help="GiB of memory per GPU."
)
@click.option(
    "--mem-frac",
    type=float,
    default=default_of("mem_frac"),
    show_default=True,
    help="Share of it a plan may use.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plan(**kw: Any) -> None:
    """Predict per-GPU memory of a training setup and the largest micro-batch that fits."""
    sizes = {k: kw[k] for k in SIZE_FLAGS}
    shape = model_shape(kw["ckpt"], sizes, kw["tied"], kw["family"])
    if kw["gpu_mem"] <= 0 or not 0 < kw["mem_frac"] <= 1:
        raise ConfigError(
            f"--gpu-mem {kw['gpu_mem']} / --mem-frac {kw['mem_frac']}: expected a positive "
            "size in GiB and a share in (0, 1]"
        )
    reference, critic, rollout = algorithm_roles(kw["algo"])
    dtype = kw["dtype"]
    if dtype == "auto":
        dtype = "bfloat16" if kw["device"] == "cuda" else "float32"
    rows = kw["max_running_prompts"] or kw["batch_size"] * kw["n_samples"]
    row_len = kw["max_prompt_tokens"] + kw["max_new_tokens"]
    setup = Setup(
        shape=shape,
        seq_len=row_len,
        micro_batch=kw["mini_bs"],
        dtype=dtype,
        device=kw["device"],
        world_size=kw["world_size"],
        tp_size=kw["tp_size"],
        dp_replicate=kw["dp_replicate"],
        lora_rank=kw["lora_rank"],
        reference=reference,
        critic=critic,
        rollout=rollout,
        rollout_rows=rows if rollout else 0,
        rollout_len=row_len if rollout else 0,
        mixed_precision=kw["fsdp_mixed_precision"],
    )
    result = estimate(setup)
    report = plan_report(result, gpu_gib=kw["gpu_mem"], mem_frac=kw["mem_frac"])
    if kw["as_json"]:
        click.echo(json.dumps(report, indent=2))
        return
    _print(result, report, kw["algo"])


def _print(result: Plan, report: dict[str, Any], algo: str) -> None:
    setup = result.setup
    table = Table(
        title=f"areno plan: {setup.shape.name} ({setup.shape.total_params() / 1e9:.2f}B "
        f"parameters), {algo}, per device of {setup.world_size}",
    )
    table.add_column("memory")
    table.add_column("GiB", justify="right")
    table.add_column("how")
    for item in (*result.items, *result.activation_items, *result.rollout_items):
        table.add_row(item.name, f"{item.bytes / GIB:,.2f}", item.note)
    console.print(table)
    budget = report["budget_gib"]
    for key, label in (("checkpointed", "with"), ("not_checkpointed", "without")):
        console.print(
            f"training step {label} activation checkpointing: "
            f"{report[f'train_step_gib_{key}']:,.2f} GiB; largest micro-batch within "
            f"{budget:,.1f} GiB: {report[f'largest_micro_batch_{key}']} rows",
            highlight=False,
        )
    if "rollout_phase_gib" in report:
        rollout = report["rollout_phase_gib"]
        verdict = "fits" if rollout <= budget else "does NOT fit; lower --max-running-prompts"
        console.print(
            f"rollout phase (resident state, KV cache and any replica): {rollout:,.2f} GiB, "
            f"{verdict} within {budget:,.1f} GiB",
            highlight=False,
        )
