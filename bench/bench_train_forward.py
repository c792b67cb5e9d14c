"""The training forward and backward of one RL microbatch: padded against packed, in one process.

    python bench/bench_train_forward.py --device cuda --dtype bfloat16 --cudnn-sdpa both
    python bench/bench_train_forward.py --model random:qwen3-small --groups 2 --prompt-tokens 64

``LocalBackend`` trains through one of two forwards (``--packed-forward``): the *padded* one
runs the right-padded [B, T] microbatch through the transformers module (rows of a GRPO group
share their prompt's keys and values when that saves enough), the *packed* one runs only the
real tokens as one stream (``areno_core.train.packed``). This script is the measurement behind
the packed default on CPUs and CUDA GPUs (docs/gpu.md). It builds a GRPO-shaped microbatch
(``--groups`` prompts, ``--group-size`` completions each, completion lengths drawn between an
eighth of ``--completion-tokens`` and all of it), then alternates the forwards on the same
model and reports for each:

* the time of forward + backward (wall, with the device synchronised at both ends), median
  and range over ``--reps``; the process's CPU time is in the JSON (on a GPU it includes the
  host's busy wait for the device);
* the peak memory above the model's own (a CUDA device's allocator peak; not read on a CPU);
* how far its log-probabilities and gradients are from a float32 run of the padded forward on
  the same weights (``--dtype bfloat16`` only): the largest and mean absolute log-probability
  error over the scored tokens, and the relative error of the gradient.

``--cudnn-sdpa`` picks torch's SDPA kernels: ``off`` is areno's setting (no cuDNN attention
on a GPU, :func:`areno_core.accel.attention.sdpa_without_cudnn`), ``on`` torch's own choice
(the ``+cudnn`` sides), ``both`` runs the four sides. The same microbatch shape repeats here,
so cuDNN's per-shape plans are built once; in training, shapes change from step to step.

The model is a random one: ``qwen3-0.6b`` (the default) is Qwen3-0.6B's configuration with
its full 151,936-token vocabulary, so the output projection and log-softmax cost what they
cost in a real run; any ``random:`` reference works too (with the byte tokenizer's vocabulary
unless ``--vocab-size`` is given).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

# Qwen3-0.6B's config.json (hidden 1024, 28 layers, 16 query and 8 key/value heads of 128).
QWEN3_06B = (
    "random:qwen3?hidden_size=1024&num_hidden_layers=28&num_attention_heads=16"
    "&num_key_value_heads=8&head_dim=128&intermediate_size=3072"
)
MODELS = {"qwen3-0.6b": (QWEN3_06B, 151936)}
FORWARDS = ("padded", "packed")
DTYPES = ("float32", "bfloat16")


def build_model(ref: str, vocab_size: int | None, dtype: Any, device: str) -> Any:
    """A random Qwen3 for ``ref`` (a key of :data:`MODELS` or a ``random:`` reference)."""
    import torch
    from transformers import Qwen3ForCausalLM

    from areno_core.models.scratch import build_random_config, parse_random_ref

    ref, default_vocab = MODELS.get(ref, (ref, None))
    spec = parse_random_ref(ref)
    config = build_random_config(spec)
    vocab = vocab_size or default_vocab
    if vocab is not None:
        config.vocab_size = vocab
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen3ForCausalLM(config)
    return model.to(device=device, dtype=dtype)


def grpo_microbatch(args: argparse.Namespace, vocab: int, device: str) -> dict[str, Any]:
    """``groups`` prompts of ``prompt_tokens`` tokens, ``group_size`` completions each,
    right-padded, the completions scored."""
    import torch

    gen = torch.Generator().manual_seed(args.seed)
    rows = args.groups * args.group_size
    low = max(1, args.completion_tokens // 8)
    lengths = torch.randint(low, args.completion_tokens + 1, (rows,), generator=gen)
    width = args.prompt_tokens + int(lengths.max())
    ids = torch.zeros(rows, width, dtype=torch.long)
    mask = torch.zeros(rows, width, dtype=torch.long)
    loss = torch.zeros(rows, width)
    for group in range(args.groups):
        prompt = torch.randint(3, vocab, (args.prompt_tokens,), generator=gen)
        for member in range(args.group_size):
            row = group * args.group_size + member
            n = args.prompt_tokens + int(lengths[row])
            ids[row, : args.prompt_tokens] = prompt
            ids[row, args.prompt_tokens : n] = torch.randint(
                3, vocab, (n - args.prompt_tokens,), generator=gen
            )
            mask[row, :n] = 1
            loss[row, args.prompt_tokens : n] = 1.0
    batch = {"input_ids": ids, "attention_mask": mask, "loss_mask": loss}
    return {k: v.to(device) for k, v in batch.items()}


def side_names(cudnn: str) -> tuple[str, ...]:
    """The measured sides: each forward, with areno's SDPA setting (cuDNN attention off on a
    GPU), with torch's own (``+cudnn``), or both."""
    plain = FORWARDS if cudnn in ("off", "both") else ()
    with_cudnn = tuple(f"{f}+cudnn" for f in FORWARDS) if cudnn in ("on", "both") else ()
    return plain + with_cudnn


def attention(side: str, device: str) -> Any:
    """areno's SDPA setting for a side, or torch's default (cuDNN allowed) for ``+cudnn``."""
    import contextlib

    import torch

    from areno_core.accel.attention import sdpa_without_cudnn

    if not side.endswith("+cudnn"):
        return sdpa_without_cudnn(device)
    torch.backends.cuda.enable_cudnn_sdp(True)
    return contextlib.nullcontext()


def forward_backward(model: Any, batch: dict[str, Any], side: str) -> Any:
    """The scored tokens' log-probabilities of one forward; their mean's gradient lands in
    the model's ``.grad``."""
    from areno_core.train.forward import policy_outputs

    model.zero_grad(set_to_none=True)
    device = str(batch["input_ids"].device)
    with attention(side, device):
        logprobs = policy_outputs(model, batch, packed=side.startswith("packed"))["logprobs"]
        scored = batch["loss_mask"] > 0
        (-logprobs[scored].float().mean()).backward()
    return logprobs.detach()[scored].float()


def flat_grad(model: Any) -> Any:
    import torch

    return torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(model: Any, batch: dict[str, Any], side: str, device: str) -> dict[str, float]:
    import torch

    cuda = device.startswith("cuda")
    synchronize(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    wall, cpu = time.perf_counter(), time.process_time()
    forward_backward(model, batch, side)
    synchronize(device)
    out = {"ms": 1e3 * (time.perf_counter() - wall), "cpu_ms": 1e3 * (time.process_time() - cpu)}
    if cuda:
        out["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    return out


def errors(
    model: Any, batch: dict[str, Any], dtype: Any, sides: tuple[str, ...]
) -> dict[str, dict[str, float]]:
    """Each side's log-probability and gradient error against a float32 padded run of the same
    weights (empty when the model already is float32)."""
    import torch

    if dtype == torch.float32:
        return {}
    reference = copy.deepcopy(model).float()
    ref_lp = forward_backward(reference, batch, "padded")
    ref_grad = flat_grad(reference)
    del reference
    out = {}
    for side in sides:
        lp = forward_backward(model, batch, side)
        grad = flat_grad(model)
        out[side] = {
            "logprob_err_max": float((lp - ref_lp).abs().max()),
            "logprob_err_mean": float((lp - ref_lp).abs().mean()),
            "grad_rel_err": float((grad - ref_grad).norm() / ref_grad.norm()),
        }
    model.zero_grad(set_to_none=True)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    common.set_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: torch {torch.__version__} sees no CUDA GPU")
    dtype = getattr(torch, args.dtype)
    model = build_model(args.model, args.vocab_size, dtype, args.device)
    if args.checkpointing:
        from areno_core.models.compat import enable_activation_checkpointing

        enable_activation_checkpointing(model)
    model.train()
    batch = grpo_microbatch(args, model.config.vocab_size, args.device)
    sides = side_names(args.cudnn_sdpa)
    for side in sides:  # warm-up: kernels, allocator
        timed(model, batch, side, args.device)
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for rep in range(args.reps):
        for side in sides if rep % 2 == 0 else sides[::-1]:
            runs[side].append(timed(model, batch, side, args.device))
    scored = int(batch["loss_mask"].sum())
    result = {
        "machine": common.machine_info(args.threads),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "config": {k: str(v) for k, v in vars(args).items()},
        "rows": int(batch["input_ids"].shape[0]),
        "padded_tokens": int(batch["input_ids"].numel()),
        "real_tokens": int(batch["attention_mask"].sum()),
        "scored_tokens": scored,
        "runs": runs,
        "errors": errors(model, batch, dtype, sides),
    }
    print_result(result)
    return result


def print_result(result: dict[str, Any]) -> None:
    runs, errs = result["runs"], result["errors"]
    print(
        f"{result['device']}, {result['config']['model']}, {result['config']['dtype']}, "
        f"checkpointing={result['config']['checkpointing']}: {result['rows']} rows, "
        f"{result['real_tokens']} real of {result['padded_tokens']} padded tokens, "
        f"{result['scored_tokens']} scored"
    )
    headers = [
        "forward",
        "ms",
        "peak MiB above weights",
        "logprob err max / mean",
        "grad rel err",
    ]
    rows = []
    for side in runs:
        ms = [r["ms"] for r in runs[side]]
        peaks = [r["peak_mib"] for r in runs[side] if "peak_mib" in r]
        err = errs.get(side)
        rows.append([
            side,
            common.spread(ms),
            f"{max(peaks):,.0f}" if peaks else "n/a",
            f"{err['logprob_err_max']:.3g} / {err['logprob_err_mean']:.3g}" if err else "n/a",
            f"{err['grad_rel_err']:.3g}" if err else "n/a",
        ])  # fmt: skip
    print(common.table(headers, rows))
    for slow, fast in (
        ("padded", "packed"),
        ("padded+cudnn", "packed+cudnn"),
        ("padded+cudnn", "padded"),
        ("packed+cudnn", "packed"),
    ):
        if slow in runs and fast in runs:
            ratios = [a["ms"] / b["ms"] for a, b in zip(runs[slow], runs[fast], strict=True)]
            print(f"{slow} / {fast} time, paired: {common.spread(ratios, 'x')}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3-0.6b", help="qwen3-0.6b or a random: reference")
    parser.add_argument("--vocab-size", type=int, default=None, help="override the vocabulary")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing on")
    parser.add_argument(
        "--cudnn-sdpa",
        choices=("off", "on", "both"),
        default="off",
        help="off: areno's setting (no cuDNN attention on a GPU); on: torch's default; both",
    )
    parser.add_argument("--groups", type=int, default=2, help="prompts in the microbatch")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--completion-tokens", type=int, default=512, help="the longest one")
    parser.add_argument("--reps", type=int, default=5, help="timed runs of each forward")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if args.device != "cpu" and not re.fullmatch(r"cuda(:\d+)?", args.device):
        parser.error(f"--device {args.device!r}: expected cpu, cuda or cuda:N")
    for name in ("groups", "group_size", "prompt_tokens", "completion_tokens", "reps", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: expected >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
