"""Rollout decode throughput: areno's native engine against ``transformers`` ``generate``.

    python bench/bench_rollout.py                       # both scenarios, batch 1, 32 and 128
    python bench/bench_rollout.py --scenario decode --batch 32 --new-tokens 128 --reps 5
    python bench/bench_rollout.py --sides areno areno-bf16 hf hf-bf16 --batch 32

Both sides load the same saved random Qwen3 and sample (temperature 1, no top-k / top-p) up to
``--new-tokens`` tokens for ``batch`` sequences. Two scenarios:

* ``decode``: the issue's microbenchmark. ``batch`` distinct random ``--prompt-len``-token
  prompts, end-of-sequence disabled, so every row produces exactly ``--new-tokens`` tokens and
  both sides do the same arithmetic.
* ``grpo``: what an RL rollout asks for. ``batch / 8`` real GSM8K questions, 8 samples each
  (``batch`` 1: one question, one sample), end-of-sequence on. ``generate`` gets every prompt
  repeated 8 times (as TRL hands it over); the native engine gets each prompt once with
  ``n=8``. Only tokens up to and including each row's end-of-sequence count as generated.

Sides (``--sides``, the first areno side is compared with the first ``hf`` side):

* ``areno``: the native engine with its defaults (float32; the lean forward pass; in the
  ``grpo`` scenario each prompt's keys/values held once per group of samples);
* ``areno-copy``: the same with ``shared_prompt_cache=False`` (every sample's row holds its own
  copy of the prompt's keys/values);
* ``areno-hf``: the native engine running the transformers module (``lean_forward=False``);
* ``areno-bf16``: the native engine on the model loaded in bfloat16 (what ``--dtype
  bfloat16`` gives a run); ``areno-bf16-unpacked``: the same with ``prepacked_weights=False``
  (oneDNN multiplies by the plain weights, as before that option);
* ``hf``: ``generate`` in float32; ``hf-bf16``: ``generate`` on the model loaded in bfloat16.

Throughput is generated tokens per second for one ``generate`` call, per wall second and per
CPU second of the process, the median of ``--calls`` calls per process after an untimed
warm-up call; each (side, batch) pair runs in its own process so its peak RSS is its own. The
table also shows the arithmetic rate the tokens imply (2 x parameters FLOPs per generated
token, prompt tokens not counted).

Work that differs (stated in the output): the native engine also returns the log-probability
of every sampled token (what RL needs); ``generate`` as configured here returns tokens only.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

SIDES = ("areno", "areno-copy", "areno-hf", "areno-bf16", "areno-bf16-unpacked", "hf", "hf-bf16")
SAMPLES_PER_PROMPT = 8  # the grpo scenario


def workload(args: Any, vocab: int) -> tuple[list[list[int]], int]:
    """The distinct prompts (token ids) and the number of samples wanted for each."""
    if args.scenario == "decode":
        import torch

        gen = torch.Generator().manual_seed(1234)
        # Byte tokens only (ids < 256): real text, never a special token.
        ids = torch.randint(0, min(vocab, 256), (args.batch, args.prompt_len), generator=gen)
        return ids.tolist(), 1
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    samples = SAMPLES_PER_PROMPT if args.batch >= SAMPLES_PER_PROMPT else 1
    rows = common.read_jsonl(common.GSM8K_DIR / "train.jsonl", limit=args.batch // samples)
    texts = [f"Question: {r['question']}\nAnswer:" for r in rows]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts], samples


def run_areno(args: Any) -> dict[str, Any]:
    common.set_threads(args.threads)
    from areno_core.contracts.engine import EngineOptions
    from areno_core.models.loading import load_model
    from areno_core.rollout.native import NativeEngine, NativeEngineConfig
    from areno_core.types import SamplingParams

    dtype = "bfloat16" if args.child.startswith("areno-bf16") else "float32"
    model = load_model(str(args.model_dir), dtype=dtype, device="cpu")
    prompts, samples = workload(args, model.config.vocab_size)
    eos = () if args.scenario == "decode" else model.generation_config.eos_token_id
    config = NativeEngineConfig(
        lean_forward=args.child != "areno-hf",
        shared_prompt_cache=args.child != "areno-copy",
        prepacked_weights=args.child != "areno-bf16-unpacked",
    )
    engine = NativeEngine(model, eos, EngineOptions(attn_backend="native"), config)
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)

    def call() -> int:
        out = engine.generate(prompts, sampling, n=samples)
        return sum(len(c.token_ids) for group in out for c in group)

    result = _timed(args, call, model)
    result["state_bytes"] = engine.state_bytes  # the KV cache kept after the last call
    return result


def run_hf(args: Any) -> dict[str, Any]:
    common.set_threads(args.threads)
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    dtype = torch.bfloat16 if args.child == "hf-bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=dtype)
    model.eval()
    prompts, samples = workload(args, model.config.vocab_size)
    rows = [p for p in prompts for _ in range(samples)]
    width = max(len(p) for p in rows)
    pad = int(model.config.pad_token_id or 0)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in rows])  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
    decode = args.scenario == "decode"
    eos = model.generation_config.eos_token_id
    eos_ids = torch.tensor([eos] if isinstance(eos, int) else list(eos))
    config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens if decode else 0,
        eos_token_id=None if decode else eos,
        pad_token_id=pad,
    )

    def call() -> int:
        torch.manual_seed(0)
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, generation_config=config)
        new = out[:, width:]
        if decode:
            return int(new.numel())
        # Count each row up to and including its first end-of-sequence token.
        ended = torch.isin(new, eos_ids)
        first = torch.where(ended.any(1), ended.int().argmax(1) + 1, new.shape[1])
        return int(first.sum())

    return _timed(args, call, model)


def _timed(args: Any, call: Any, model: Any) -> dict[str, Any]:
    call()  # warm-up: allocations, kernel selection, lazy imports
    common.start_profiler()  # only under --profile
    walls, cpus, counts = [], [], []
    for _ in range(args.calls):
        began, began_cpu = time.perf_counter(), time.process_time()
        tokens = call()
        walls.append(time.perf_counter() - began)
        cpus.append(time.process_time() - began_cpu)
        counts.append(tokens)
    if args.scenario == "decode" and tokens != args.batch * args.new_tokens:
        raise RuntimeError(f"expected {args.batch * args.new_tokens} tokens, got {tokens}")
    params = sum(p.numel() for p in model.parameters())
    per_wall = [n / w for n, w in zip(counts, walls, strict=True)]
    per_cpu = [n / c for n, c in zip(counts, cpus, strict=True)]
    rate = common.median(per_wall)
    return {
        "tokens_per_s": rate,
        "tokens_per_cpu_s": common.median(per_cpu),
        "gflops_per_s": 2 * params * rate / 1e9,
        "gflops_per_cpu_s": 2 * params * common.median(per_cpu) / 1e9,
        "rates": per_wall,
        "cpu_rates": per_cpu,
        "tokens": counts,
    }


def drive(args: Any) -> dict[str, Any]:
    report: dict[str, Any] = {"machine": common.machine_info(args.threads), "scenarios": {}}
    print(f"machine: {report['machine']}")
    scenarios = ["decode", "grpo"] if args.scenario == "all" else [args.scenario]
    with tempfile.TemporaryDirectory(prefix="areno-bench-") as tmp:
        model_dir = common.save_random_model(args.model, Path(tmp) / "model")
        for scenario in scenarios:
            report["scenarios"][scenario] = run_scenario(args, scenario, model_dir)
    print(
        "\nNot the same work: the native engine also returns each sampled token's logprob; "
        "generate returns tokens only."
    )
    return report


def run_scenario(args: Any, scenario: str, model_dir: Path) -> dict[str, Any]:
    if scenario == "decode":
        what = f"{args.prompt_len}-token random prompts, EOS off"
    else:
        what = f"GSM8K prompts x {SAMPLES_PER_PROMPT} samples (batch 1: 1 x 1), EOS on"
    print(
        f"\n== rollout, scenario {scenario}: {args.model}, {what}, up to {args.new_tokens} new "
        f"tokens, sampling at temperature 1; {args.reps} processes per side x {args.calls} "
        f"timed calls; sides {', '.join(args.sides)}"
    )
    out: dict[str, Any] = {}
    rows = []
    keys = ["tokens_per_s", "tokens_per_cpu_s", "gflops_per_cpu_s", "peak_rss_mib", "state_bytes"]
    for batch in args.batch:
        print(f"batch {batch}:")
        base = ["--model-dir", str(model_dir), "--threads", str(args.threads)]
        base += ["--scenario", scenario, "--batch", str(batch), "--calls", str(args.calls)]
        base += ["--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens)]

        def run_one(side: str, rep: int, base: list[str] = base) -> dict[str, Any]:
            return common.run_child(Path(__file__), [*base, "--child", side])

        results = common.interleaved(args.sides, args.reps, run_one)
        summary = common.summarize(results, keys)
        reference = next((s for s in args.sides if s.startswith("hf")), args.sides[-1])
        ratios = {
            side: {
                "cpu": common.paired_ratios(results, side, reference, "tokens_per_cpu_s"),
                "wall": common.paired_ratios(results, side, reference, "tokens_per_s"),
            }
            for side in args.sides
            if side != reference
        }
        out[str(batch)] = {
            "runs": results,
            "median": summary,
            "reference": reference,
            "ratios": ratios,
        }
        for side in args.sides:
            s = summary[side]
            ratio = ratios.get(side)
            rows.append(
                [
                    batch,
                    side,
                    common.spread([r["tokens_per_cpu_s"] for r in results[side]]),
                    common.spread([r["tokens_per_s"] for r in results[side]]),
                    "-" if ratio is None else common.spread(ratio["cpu"], "x"),
                    "-" if ratio is None else common.spread(ratio["wall"], "x"),
                    s["gflops_per_cpu_s"],
                    s["peak_rss_mib"],
                    f"{s['state_bytes'] / 2**20:.1f}" if "state_bytes" in s else "-",
                    f"{s['load_min']:.1f}-{s['load_max']:.1f}",
                ]
            )
    print()
    print(
        common.table(
            [
                "batch",
                "side",
                "tok per CPU-s",
                "tok per wall-s",
                "ratio per CPU-s",
                "ratio per wall-s",
                "GFLOP per CPU-s",
                "peak RSS MiB",
                "KV state MiB",
                "load",
            ],
            rows,
        )
    )
    print("(median (min-max) over processes; ratios are paired runs against the first hf side)")
    return out


def child_result(args: Any) -> dict[str, Any]:
    args.batch = args.batch[0]  # the driver gives each child one batch size
    runner = run_areno if args.child.startswith("areno") else run_hf
    return runner(args)


def main() -> None:
    parser = common.base_parser(__doc__.split("\n\n")[0], profile=True)
    parser.add_argument("--model", default="random:qwen3-small", help="random: model to build")
    parser.add_argument("--scenario", choices=["decode", "grpo", "all"], default="all")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128])
    parser.add_argument("--prompt-len", type=int, default=32, help="decode scenario")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--calls", type=int, default=3, help="timed generate calls per process")
    parser.add_argument(
        "--sides", nargs="+", choices=SIDES, default=["areno", "hf"], help="what to compare"
    )
    common.run_role(parser, child=child_result, drive=drive)


if __name__ == "__main__":
    main()
