"""A torchrun worker for the planner's FSDP2 check (not a test file).

    torchrun --standalone --nproc-per-node 2 plan_worker.py --out result.json

Shards ``random:qwen3-small`` over 2 processes with the distributed backend, takes one GRPO
step (so the AdamW state exists), then runs one more forward and backward pass of a
micro-batch under :class:`LiveBytes`; rank 0 writes this rank's bytes of parameter shards,
gradient shards and optimizer state, and the pass's peak of new allocations.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from equality_worker import groups

from areno_core.backend import TrainableModel
from areno_core.plan.measure import LiveBytes
from areno_core.train.distributed.backend import DistributedBackend
from areno_core.train.distributed.context import init_distributed
from areno_core.train.forward import policy_outputs


def local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    ctx = init_distributed(world_size=2, tp_size=1, timeout_s=120)
    backend = DistributedBackend(ctx, mixed_precision=False)
    model = TrainableModel.from_ckpt("random:qwen3-small", seed=0)
    backend.train(
        model, groups(0), algorithm="grpo", learning_rate=1e-4, mini_bs=2,
        activation_checkpointing=False,
    )  # fmt: skip
    params = list(model.policy.parameters())
    state = [v for s in model.optimizer.state.values() for v in s.values() if v.dim() > 0]
    ids = torch.randint(
        3, 250, (args.rows, args.tokens), generator=torch.Generator().manual_seed(1)
    )
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    mode = LiveBytes()
    with mode:
        out = policy_outputs(model.policy, batch, share_prefix=False)
        out["logprobs"].mean().backward()
    grads = [p.grad for p in params if p.grad is not None]
    result = {
        "weights": local_bytes(params),
        "gradients": local_bytes(grads),
        "optimizer": local_bytes(state),
        "peak": mode.peak,
        "rows": args.rows,
        "tokens": args.tokens,
    }
    if ctx.is_main:
        Path(args.out).write_text(json.dumps(result))
    ctx.barrier()


if __name__ == "__main__":
    main()
