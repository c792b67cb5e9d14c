"""A torchrun worker for the equality tests of the distributed backend (not a test file).

    torchrun --standalone --nproc-per-node 2 equality_worker.py --world-size 2 --layouts 1:3,2:1
    torchrun --standalone --nproc-per-node 4 equality_worker.py --world-size 4 --replicate 2

For each layout (tensor-parallel size : steps) every rank trains fresh copies of
``random:qwen3-tiny`` with ``DistributedBackend`` for a few steps of SFT, DPO, GRPO and PPO on
fixed data (the same global batch on every rank); rank 0 then trains the same models with
``LocalBackend`` (prefix sharing off, like the distributed backend) on the same data in its
own process, and writes, per algorithm, the largest weight difference after those steps and
both runs' losses. With tensor parallelism it also writes the largest difference of the
sharded policy's forward logprobs from the unsharded ones. With ``--replicate R`` the
data-parallel ranks are sharded as ``R`` replica groups (hybrid sharding), and each entry also
records how the first parameter is placed on the mesh and the size of this rank's shard.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import torch

from areno_core.backend import LocalBackend, TrainableModel
from areno_core.train.distributed.backend import DistributedBackend
from areno_core.train.distributed.context import init_distributed
from areno_core.types import PromptItem, Trajectory, TrajectoryGroup

REPO = Path(__file__).resolve().parents[3]
OPTIONS: dict[str, Any] = {
    "mini_bs": 2,
    "max_new_tokens": 48,
    "max_prompt_tokens": 96,
}


def gsm8k(count: int) -> list[dict[str, str]]:
    with (REPO / "data" / "gsm8k" / "train.jsonl").open() as f:
        rows = [json.loads(next(f)) for _ in range(count)]
    return [{"question": r["question"][:60], "answer": r["answer"][:40]} for r in rows]


def sft_rows() -> list[dict[str, str]]:
    return [{"prompt": r["question"], "response": r["answer"]} for r in gsm8k(8)]


def dpo_rows() -> list[dict[str, str]]:
    return [
        {"prompt": r["question"], "chosen": r["answer"], "rejected": "I do not know."}
        for r in gsm8k(6)
    ]


def groups(step: int) -> list[TrajectoryGroup]:
    """Four prompts x three samples of fixed tokens, lengths and rewards."""
    gen = torch.Generator().manual_seed(100 + step)
    out = []
    for p in range(4):
        prompt = torch.randint(3, 250, (5 + p,), generator=gen).tolist()
        item = PromptItem(index=p, row={"prompt": "x"}, prompt="x")
        samples = []
        for s in range(3):
            n = 3 + (p + s) % 4
            tokens = torch.randint(3, 250, (n,), generator=gen).tolist()
            samples.append(
                Trajectory(
                    input_ids=prompt + tokens,
                    loss_mask=[0] * len(prompt) + [1] * n,
                    rollout_logprobs=[0.0] * len(prompt) + [-5.5] * n,
                    reward=float(torch.rand((), generator=gen)),
                    prompt_len=len(prompt),
                    prompt_index=p,
                    sample_index=s,
                )
            )
        out.append(TrajectoryGroup(item=item, trajectories=samples))
    return out


PPO = {"critic_warmup_steps": 0, "critic_lr": 1e-3}
CASES: dict[str, dict[str, Any]] = {
    "sft": {"algo": "sft", "data": lambda step: sft_rows(), "options": {}},
    "dpo": {
        "algo": "dpo",
        "data": lambda step: dpo_rows(),
        "options": {"gradient_accumulation_steps": 2},
    },
    "grpo": {"algo": "grpo", "data": groups, "options": {}},
    "ppo": {"algo": "ppo", "data": groups, "options": PPO},
    # No KL loss and no reference given: no reference may be scored (a reference would move
    # a KL penalty into the rewards).
    "ppo_no_kl": {"algo": "ppo", "data": groups, "options": {**PPO, "use_kl_loss": False}},
}


def train(backend: Any, model: TrainableModel, case: str, steps: int, lr: float) -> list[float]:
    spec = CASES[case]
    losses = []
    for step in range(steps):
        result = backend.train(
            model, spec["data"](step), algorithm=spec["algo"], learning_rate=lr, **OPTIONS,
            **spec["options"],
        )  # fmt: skip
        losses.append(result.metrics["train/loss"])
    return losses


def full_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def forward_diff(ctx: Any) -> float:
    from areno_core.train.distributed.parallelize import shard_module
    from areno_core.train.forward import policy_outputs

    plain = TrainableModel.from_ckpt("random:qwen3-tiny").policy
    sharded = TrainableModel.from_ckpt("random:qwen3-tiny").policy
    shard_module(sharded, ctx, mixed_precision=False)
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 250, (3, 17), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        want = policy_outputs(plain, batch, share_prefix=False)["logprobs"]
        got = policy_outputs(sharded, batch, share_prefix=False)["logprobs"]
    return float((want - got).abs().max())


def context_for(ctx: Any, tp_size: int) -> Any:
    """``ctx`` with a ``(world / tp_size, tp_size)`` mesh over the same processes (and the same
    replica groups)."""
    if tp_size == ctx.tp_size:
        return ctx
    from areno_core.train.distributed.context import DistContext, build_mesh

    replicate = ctx.replicate_size
    mesh = build_mesh("cpu", ctx.world_size, tp_size, replicate)
    return DistContext(
        ctx.rank, ctx.world_size, ctx.local_rank, tp_size, ctx.device, mesh, replicate
    )


def placement(module: torch.nn.Module) -> dict[str, Any]:
    """How the first parameter is laid out on the mesh, and this rank's share of it."""
    param = next(module.parameters())
    return {
        "placements": [str(p) for p in param.placements],
        "local_numel": param.to_local().numel(),
        "numel": param.numel(),
    }


def run_layout(ctx: Any, steps: int, lr: float, cases: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if ctx.tp_size > 1:
        result["forward"] = forward_diff(ctx)
    for case in cases:
        backend = DistributedBackend(ctx, mixed_precision=False)
        model = TrainableModel.from_ckpt("random:qwen3-tiny", seed=0)
        losses = train(backend, model, case, steps, lr)
        policy = full_weights(model.policy)
        critic = full_weights(model.critic) if model.critic is not None else None
        if ctx.is_main:
            local = TrainableModel.from_ckpt("random:qwen3-tiny", seed=0)
            local_losses = train(LocalBackend(share_prefix=False), local, case, steps, lr)
            start = TrainableModel.from_ckpt("random:qwen3-tiny", seed=0).policy.state_dict()
            entry = {
                "policy": max_diff(policy, local.policy.state_dict()),
                "moved": max_diff(policy, start),
                "losses": losses,
                "local_losses": local_losses,
                "optimizer_steps": [model.optimizer_steps, local.optimizer_steps],
                "sharding": placement(model.policy),
            }
            if critic is not None:
                entry["critic"] = max_diff(critic, local.critic.state_dict())
            result[case] = entry
        ctx.barrier()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument(
        "--layouts",
        default="1:3",
        help="comma-separated TP:STEPS, e.g. 1:3,2:1 (dp=2 for 3 steps, then tp=2 for 1 step)",
    )
    parser.add_argument("--replicate", type=int, default=1, help="replica groups (HSDP)")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    logging.getLogger("torch.distributed").setLevel(logging.ERROR)
    layouts = [tuple(int(x) for x in item.split(":")) for item in args.layouts.split(",")]
    ctx = init_distributed(
        world_size=args.world_size, tp_size=layouts[0][0], timeout_s=120, replicate=args.replicate
    )
    result = {
        f"tp{tp}": run_layout(context_for(ctx, tp), steps, args.lr, args.cases.split(","))
        for tp, steps in layouts
    }
    if ctx.is_main:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
