"""The benchmark harness runs: each script's areno side on a tiny workload, the rollout
driver end to end (areno against transformers generate), and TRL's side where TRL is
installed (``pip install -e ".[bench]"``). Speed is never asserted here; bench/ measures it."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
HAS_TRL = importlib.util.find_spec("trl") is not None


def bench(
    script: str, *args: str, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=None if env is None else {**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def child_result(proc: subprocess.CompletedProcess[str]) -> dict:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(lines[-1].removeprefix("BENCH_RESULT "))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    sys.path.insert(0, str(BENCH))
    try:
        import common  # bench/common.py
    finally:
        sys.path.remove(str(BENCH))
    return common.save_random_model("random:qwen3-tiny", tmp_path_factory.mktemp("m") / "model")


GRPO_CHILD = ["--shape", "tiny", "--steps", "2", "--warmup", "1", "--prompts", "2", "--seed", "0"]
SFT_CHILD = ["--model", "random:qwen3-tiny", "--batch", "4", "--micro-bs", "2", "--steps", "1",
             "--warmup", "1"]  # fmt: skip


@pytest.mark.parametrize("side", ["areno", pytest.param("trl", marks=pytest.mark.skipif(
    not HAS_TRL, reason="TRL is a bench extra: pip install -e '.[bench]'"))])  # fmt: skip
def test_grpo_child_reports_throughput_rewards_and_memory(model_dir, side) -> None:
    result = child_result(
        bench("bench_grpo.py", "--child", side, "--model-dir", str(model_dir), *GRPO_CHILD)
    )
    assert result["samples_per_s"] > 0 and result["step_s"] > 0
    assert result["steps"] == 3 and len(result["rewards"]) == 3
    assert all(0.0 <= r <= 1.0 for r in result["rewards"])
    assert result["peak_rss_mib"] > 50


# The padded sides (areno's and TRL's default) run with -m slow: the packed and padding-free
# sides cover the same harness code, and CI stays under its 30 minutes.
NEEDS_TRL = pytest.mark.skipif(
    not HAS_TRL, reason="TRL is a bench extra: pip install -e '.[bench]'"
)


@pytest.mark.parametrize("side", [
    pytest.param("areno", marks=pytest.mark.slow), "areno-packed", "areno-packed-bf16",
    pytest.param("trl", marks=[NEEDS_TRL, pytest.mark.slow]),
    pytest.param("trl-padfree", marks=NEEDS_TRL)])  # fmt: skip
def test_sft_child_counts_the_same_target_tokens(model_dir, side) -> None:
    result = child_result(
        bench("bench_sft.py", "--child", side, "--model-dir", str(model_dir), *SFT_CHILD)
    )
    assert result["target_tokens_per_s"] > 0 and result["target_tokens_per_cpu_s"] > 0
    # Every side trains on the same pre-tokenized rows in the same order.
    assert result["target_tokens"] == 1093.0
    assert result["tokens"] > result["target_tokens"]  # prompts too
    if side.startswith("areno"):
        assert len(result["losses"]) == 2
        assert all(2.0 < loss < 10.0 for loss in result["losses"])  # ~ln(vocab) at the start


def test_sft_no_split_replaces_what_the_updater_calls(model_dir, monkeypatch) -> None:
    """``--no-split`` must reach the supervised updater: the updater asks
    ``areno_core.train.update._piece_cost`` where to cut, and the flag replaces that name (it
    once patched a name nothing read, and measured nothing)."""
    from areno_core.train import update

    sys.path.insert(0, str(BENCH))
    try:
        import bench_sft
    finally:
        sys.path.remove(str(BENCH))
    monkeypatch.setattr(bench_sft.common, "emit", lambda result, name="child": None)
    asked = []
    monkeypatch.setattr(update, "_piece_cost", lambda model, device: asked.append(1))
    child = ["bench_sft.py", "--child", "areno", "--model-dir", str(model_dir), *SFT_CHILD]
    monkeypatch.setattr(sys, "argv", child)
    bench_sft.main()
    assert asked, "the updater no longer asks update._piece_cost where to cut"
    before = len(asked)
    monkeypatch.setattr(sys, "argv", [*child, "--no-split"])
    bench_sft.main()
    assert len(asked) == before  # the flag's replacement answered, not the original
    assert update._piece_cost(None, None) is None


def test_profile_writes_the_timed_steps_operator_tables(model_dir, tmp_path) -> None:
    """``--profile DIR`` reaches a child through ARENO_BENCH_PROFILE_DIR: its timed steps run
    under torch.profiler and it writes their operator tables (own CPU time, own memory)."""
    env = {"ARENO_BENCH_PROFILE_DIR": str(tmp_path)}
    args = ["--child", "areno-packed", "--model-dir", str(model_dir), *SFT_CHILD]
    result = child_result(bench("bench_sft.py", *args, env=env))
    written = Path(result["profile"])
    assert written.parent == tmp_path and written.name.startswith("areno-packed-")
    text = written.read_text()
    assert "by own CPU time" in text and "by own memory allocated" in text
    assert "aten::mm" in text  # the training step's matrix products were recorded


@NEEDS_TRL
def test_sft_trl_packing_counts_only_the_sequences_it_trained(model_dir) -> None:
    """TRL's loader collates one microbatch ahead of the one it trains; the packing side must
    count the timed steps' packed sequences, not the one collated last (it once did, which
    overstated TRL's packing throughput by a fifth at ``--steps 2``)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.data_utils import pack_dataset

    from areno_core.train.featurize import sft_trajectories

    sys.path.insert(0, str(BENCH))
    try:
        import bench_sft
    finally:
        sys.path.remove(str(BENCH))
    result = child_result(
        bench("bench_sft.py", "--child", "trl-packing", "--model-dir", str(model_dir), *SFT_CHILD)
    )
    # SFT_CHILD: 4 rows a step in microbatches of 2 (one packed sequence each), 1 warm-up and
    # 1 timed step: the timed microbatches are the 3rd and 4th sequences, the epoch repeating
    # in order when it has fewer.
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = bench_sft.sft_rows(8)
    trajectories, _ = sft_trajectories(rows, tokenizer, max_prompt_tokens=4096, max_new_tokens=4096)
    dataset = Dataset.from_list(
        [{"input_ids": t.input_ids, "completion_mask": t.loss_mask} for t in trajectories]
    )
    packed = pack_dataset(dataset, bench_sft.PACK_TOKENS, strategy="bfd")
    timed = [packed[i % len(packed)] for i in (2, 3)]
    assert result["target_tokens"] == sum(sum(s["completion_mask"][1:]) for s in timed)
    assert result["tokens"] == sum(len(s["input_ids"]) for s in timed)


def test_rollout_driver_runs_both_sides_and_writes_ratios(tmp_path) -> None:
    out = tmp_path / "rollout.json"
    proc = bench(
        "bench_rollout.py", "--model", "random:qwen3-tiny", "--scenario", "decode",
        "--batch", "2", "--new-tokens", "4", "--calls", "1", "--reps", "1", "--json", str(out),
    )  # fmt: skip
    assert "| batch | side | tok per CPU-s | tok per wall-s | ratio per CPU-s |" in proc.stdout
    report = json.loads(out.read_text())
    decode = report["scenarios"]["decode"]["2"]
    for side in ("areno", "hf"):
        median = decode["median"][side]
        assert median["tokens_per_s"] > 0 and median["tokens_per_cpu_s"] > 0
        assert median["peak_rss_mib"] > 50
    assert decode["reference"] == "hf" and len(decode["ratios"]["areno"]["cpu"]) == 1
    runs = decode["runs"]
    assert runs["areno"][0]["tokens"] == runs["hf"][0]["tokens"] == [8]  # same work


def _bench_module(name: str):
    """``bench/<name>.py`` imported as ``name`` (the bench scripts import each other that way)."""
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


def _common():
    return _bench_module("common")


def _bench_grpo():
    return _bench_module("bench_grpo")


def test_grpo_score_text_full_reward_only_for_the_answer_at_the_start() -> None:
    score = _bench_grpo().score_text
    assert score(" 5 apples", "5") == 1.0
    assert score("57", "57") == 1.0
    assert score("\n42.", "42") == 1.0
    # The answer inside other text, or as the start of a longer number: the digit share only.
    assert score("ab5cd", "5") == 0.2
    assert score("x 42 y", "42") == 2 / 6
    assert score("57ab", "5") == 0.5
    assert score("", "5") == 0.0
    assert score("abc1", "") == 0.25


def test_grpo_score_text_on_random_bytes_is_about_the_digit_share() -> None:
    """What a random model's first rollout earns: a one-digit answer turns up somewhere in
    about a fifth of 64 random bytes, so paying 1.0 for "answer anywhere" made the step-1
    reward a lottery over a few lucky samples instead of the digit share both sides share."""
    bench_grpo = _bench_grpo()
    rng = random.Random(0)
    texts = [bytes(rng.randrange(256) for _ in range(64)).decode(errors="replace")
             for _ in range(400)]  # fmt: skip
    assert sum("5" in t for t in texts) / len(texts) > 0.15  # the lottery the old rule paid
    scores = [bench_grpo.score_text(t, "5") for t in texts]
    shares = [bench_grpo.digit_share(t) for t in texts]
    mean_share = sum(shares) / len(shares)
    assert 0.02 < mean_share < 0.06  # ~10 digit bytes of 256, U+FFFD for the bytes >= 0x80
    assert abs(sum(scores) / len(scores) - mean_share) < 0.005


def test_paired_ratios_divide_run_by_run_and_skip_missing_values() -> None:
    common = _common()
    results = {
        "a": [{"x": 6.0}, {"x": 3.0}, {"y": 1.0}],
        "b": [{"x": 2.0}, {"x": 3.0}, {"x": 1.0}],
    }
    assert common.paired_ratios(results, "a", "b", "x") == [3.0, 1.0]
    assert common.spread([3.0, 1.0, 2.0], "x") == "2x (1-3)"
    assert common.spread([]) == "n/a"


def test_summarize_reports_median_min_max_and_load_range() -> None:
    common = _common()
    runs = [
        {"v": 1.0, "load_before": 2.0, "load_after": 3.0},
        {"v": 5.0, "load_before": 1.0, "load_after": 6.0},
        {"v": 2.0, "load_before": 2.5, "load_after": 2.0},
    ]
    row = common.summarize({"s": runs}, ["v"])["s"]
    assert (row["v"], row["v_min"], row["v_max"]) == (2.0, 1.0, 5.0)
    assert (row["load_min"], row["load_max"], row["reps"]) == (1.0, 6.0, 3.0)


def test_rates_are_per_wall_and_per_cpu_second() -> None:
    rates = _common().rates("tok", 100.0, wall=4.0, cpu=2.0)
    assert rates == {"tok_per_s": 25.0, "tok_per_cpu_s": 50.0}


def test_ceiling_reports_matmul_peak_and_step_fraction(tmp_path) -> None:
    out = tmp_path / "ceiling.json"
    # The tiny shape: the same code as the default (larger) shape, on the tiny model, whose
    # step takes a fraction of a second instead of about 30 s; no number is asserted that
    # depends on the model's size.
    proc = bench("bench_ceiling.py", "--shape", "tiny", "--steps", "2", "--prompts", "1",
                 "--repeats", "1", "--probe-repeats", "1", "--json", str(out))  # fmt: skip
    assert "peak:" in proc.stdout and "whole GRPO step" in proc.stdout
    assert "random:qwen3-tiny, 1 GSM8K prompts x 8 samples, 8 new tokens" in proc.stdout
    report = json.loads(out.read_text())
    matmul = report["matmul"]
    assert matmul["peak_flops"] == max(matmul["per_shape_flops"].values())
    assert matmul["peak_flops_cpu"] == max(matmul["per_shape_flops_cpu"].values())
    assert matmul["peak_flops"] > 1e9
    grpo = report["grpo"]
    assert grpo["rollout_flops"] > 0 and grpo["update_flops"] > grpo["rollout_flops"]
    assert grpo["rollout_s"] > 0 and grpo["update_s"] > 0
    # The peak is measured again before each timed step and after the last one, and each
    # step's share is against the mean of the two around it.
    probes, steps = grpo["probes"], grpo["steps"]
    assert len(steps) == 2 and len(probes) == 3
    for i, step in enumerate(steps):
        around = (probes[i]["peak_flops_cpu"] + probes[i + 1]["peak_flops_cpu"]) / 2
        assert step["peak_flops_cpu"] == pytest.approx(around)
        assert step["update_cpu_s"] > 0 and step["rollout_cpu_s"] > 0
    update = report["shares"]["update (forward + backward)"]["share_cpu"]
    assert all(s["update_flops"] > 0 for s in steps)  # counted for each timed step
    expected = [s["update_flops"] / s["update_cpu_s"] / s["peak_flops_cpu"] for s in steps]
    assert update == pytest.approx(expected)


@pytest.mark.parametrize(
    ("script", "argument", "error", "first_output"),
    [
        ("bench_ceiling.py", ["--probe-repeats", "0"],
         "--probe-repeats must be at least 1, got 0", "matmul throughput"),
        ("bench_agentic_overlap.py", ["--steps", "3"],
         "--steps must be at least 4 (steady state from step 3 on), got 3", "agentic grpo"),
        ("bench_agentic_overlap.py", ["--sides", "sync+plain,fill-2+fancy"],
         "unknown side(s) fill-2+fancy; choose from sync, async-1, async-2, fill-1, fill-2, "
         "each optionally with +plain", "agentic grpo"),
        ("bench_train_forward.py", ["--groups", "0"], "--groups 0: expected >= 1", "rows,"),
        ("bench_train_forward.py", ["--device", "gpu"],
         "--device 'gpu': expected cpu, cuda or cuda:N", "rows,"),
    ],
)  # fmt: skip
def test_bench_refuses_bad_arguments_before_measuring(script, argument, error, first_output):
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *argument],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert error in proc.stderr
    assert first_output not in proc.stdout


def test_grpo_phases_alternates_configurations_in_one_process(tmp_path) -> None:
    out = tmp_path / "phases.json"
    proc = bench(
        "bench_grpo_phases.py", "--steps", "2", "--config", "packed=off,shared=on",
        "--config", "packed=on", "--json", str(out),
    )  # fmt: skip
    results = json.loads(out.read_text())["results"]
    assert [r["config"] for r in results] == ["packed=off,shared=on", "packed=on,shared=auto"]
    for r in results:
        assert 0 < r["rollout_ms"] < r["step_ms"] and 0 < r["update_ms"] < r["step_ms"]
        assert r["step_ms_min"] <= r["step_ms"] <= r["step_ms_max"]
        assert 0.0 <= r["reward_last3"] <= 1.0
    assert "packed=on,shared=auto" in proc.stdout


def test_grpo_phases_refuses_an_unknown_setting_before_measuring() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_grpo_phases.py"), "--config", "packed=maybe"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--config 'packed=maybe'" in proc.stderr and "got 'packed=maybe'" in proc.stderr
    assert "machine:" not in proc.stdout


@pytest.mark.slow
def test_async_bench_runs_both_sides_and_reports_accuracy_and_cpu_time(tmp_path) -> None:
    out = tmp_path / "async.json"
    proc = bench("bench_async.py", "--reps", "1", "--max-steps", "3", "--sides", "sync,async",
                 "--json", str(out), timeout=600)  # fmt: skip
    assert "| side | steps | samples/s (run) |" in proc.stdout
    runs = json.loads(out.read_text())["runs"]
    for side in ("sync", "async"):
        (run,) = runs[side]
        assert run["steps"] == 3 and run["samples_per_s"] > 0 and run["cpu_s"] > 0
        assert 0.0 <= run["accuracy"] <= 1.0
        assert run["time/train"] > 0  # the steady-state split the bound is computed from
    assert runs["sync"][0]["time/rollout"] > 0
    assert "at most" in proc.stdout and "with a free proximal pass" in proc.stdout
    assert runs["async"][0]["time/weight_sync"] >= 0  # only the worker side publishes weights
    assert "time/weight_sync" not in runs["sync"][0]


@pytest.mark.slow
def test_agentic_overlap_bench_runs_and_reports_overlap(tmp_path) -> None:
    out = tmp_path / "overlap.json"
    proc = bench("bench_agentic_overlap.py", "--reps", "1", "--steps", "4", "--threads", "1",
                 "--sides", "sync,async-2,fill-2", "--slow-s", "0.5", "--json", str(out),
                 timeout=600)  # fmt: skip
    assert "| side | samples/s (run) | samples/s (steady) |" in proc.stdout
    runs = json.loads(out.read_text())["runs"]
    for side in ("sync", "async-2", "fill-2"):
        (run,) = runs[side]
        assert run["steps"] == 4 and run["steady_samples_per_s"] > 0 and run["cpu_s"] > 0
        # The steady state's CPU time is part of the whole run's (Linux: read from /proc).
        assert 0 < run["steady_cpu_s_per_sample"] * 32 < run["cpu_s"]
    assert runs["async-2"][0]["overlapped_share"] > 0  # batches 1 and 2 started together
    assert "overlapped_share" not in runs["sync"][0]


def test_distributed_child_reports_sharded_state_peak_memory_and_step_time(model_dir) -> None:
    # One process (world1): the torchrun side is covered by tests/train/distributed.
    result = child_result(
        bench(
            "bench_distributed.py", "--child", "world1", "--model-dir", str(model_dir),
            "--batch", "4", "--micro-bs", "2", "--steps", "1", "--warmup", "1",
            "--max-tokens", "32",
        )
    )  # fmt: skip
    assert result["world"] == 1 and result["rank"] == 0
    assert result["step_s"] > 0 and result["cpu_s_per_step"] > 0
    # fp32 parameters of the tiny model, and two AdamW moments of the same size
    assert result["param_mib"] == pytest.approx(result["parameters"] * 4 / 2**20, rel=0.01)
    assert result["optimizer_mib"] == pytest.approx(2 * result["param_mib"], rel=0.01)
    assert result["peak_step_rss_mib"] >= result["held_rss_mib"] > 100  # torch alone takes more
    assert len(result["losses"]) == 2


def test_lora_child_trains_adapters_without_a_reference_copy(model_dir) -> None:
    pytest.importorskip("peft", reason="LoRA needs peft: pip install 'areno-core[lora]'")
    common = ["--model-dir", str(model_dir), "--algo", "dpo", "--batch", "2", "--samples", "2",
              "--length", "8", "--steps", "1", "--warmup", "1", "--lora-rank", "4"]  # fmt: skip
    lora = child_result(bench("bench_lora.py", "--child", "lora", *common))
    full = child_result(bench("bench_lora.py", "--child", "full", *common))
    # rank 4 x (in + out) per projection: q, o 64+64; k, v 64+32; gate, up, down 64+128; 2 layers
    assert lora["trainable_params"] == 2 * 4 * (2 * 128 + 2 * 96 + 3 * 192) == 8192
    assert full["trainable_params"] == 91_520.0
    assert not lora["reference_copied"]
    assert full["reference_copied"]  # the DPO reference of a full fine-tune is a copy
    for result in (lora, full):
        assert result["train_peak_mib"] >= result["rss_loaded_mib"] > 50
        assert result["step_s"] > 0 and result["step_cpu_s"] > 0


def test_bench_counts_the_cpu_time_of_a_process_and_its_children() -> None:
    if not Path("/proc/self/stat").is_file():
        pytest.skip("reads /proc")
    overlap = _common()
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.process_time() + 0.5\n"
         "while time.process_time() < end: pass\ntime.sleep(30)"]
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20  # until the child has done its busy half second
        while (overlap.tree_cpu_s(child.pid) or 0.0) < 0.5 and time.monotonic() < deadline:
            time.sleep(0.05)
        own = time.process_time()
        # This process's CPU time, plus the child's half second of busy work.
        assert overlap.tree_cpu_s(os.getpid()) >= own + 0.45
        assert overlap.tree_cpu_s(child.pid) == pytest.approx(0.5, abs=0.2)
    finally:
        child.kill()
        child.wait()
    assert overlap.tree_cpu_s(10**9) is None  # no such process


def test_steady_cpu_spans_the_steps_logged_after_the_second() -> None:
    common = _common()
    # (steps logged, CPU s of the process tree) each time the count grew
    assert common.steady_cpu([(1, 3.0), (2, 4.0), (4, 6.5), (5, 7.25)]) == (2, 5, 3.25)
    assert common.steady_cpu([(3, 1.0), (6, 4.0)]) == (3, 6, 3.0)  # step 2 came with step 3
    assert common.steady_cpu([(1, 1.0), (3, 2.0)]) is None  # one mark from step 2 on
    assert common.steady_cpu([]) is None
    runs = [{"steady_cpu_s_per_sample": v} for v in (0.5, 0.25, 1.0)]
    assert common.steady_cpu_column(runs) == "0.5 (0.25-1)"
    assert common.steady_cpu_column([*runs, {"steady_cpu_s_per_sample": None}]).startswith("n/a")
    assert common.maybe(None) == "n/a" and common.maybe(0.12345, 2) == "0.12"


def test_against_pairs_each_side_with_the_reference_run_by_run() -> None:
    common = _common()
    results = {
        "sync": [{"x": 2.0}, {"x": 4.0}, {"x": 1.0}],
        "async": [{"x": 3.0}, {"x": None}, {"x": 3.0}],
    }
    (blank, line) = common.against(results, "sync", [("x", "speed")])
    assert blank == "" and line == "async / sync, paired: speed 2.25x (1.5-3)"
    assert common.against(results, "absent", [("x", "speed")]) == []


def test_watch_run_reads_the_cpu_time_at_each_logged_step_and_interrupts_once(tmp_path) -> None:
    if not Path("/proc/self/stat").is_file():
        pytest.skip("reads /proc")
    common = _common()
    metrics = tmp_path / "metrics.jsonl"
    # A run that logs step 0 (not a step), then a step after each 0.3 s of busy CPU time until
    # SIGINT, then one more step (the one in flight) and exits.
    script = (
        "import json, sys, time\n"
        f"path = {str(metrics)!r}\n"
        "def log(step):\n"
        "    with open(path, 'a') as f: f.write(json.dumps({'step': step}) + '\\n')\n"
        "log(0)\nstep = 0\n"
        "try:\n"
        "    while True:\n"
        "        end = time.process_time() + 0.3\n"
        "        while time.process_time() < end: pass\n"
        "        step += 1; log(step); time.sleep(0.2)\n"
        "except KeyboardInterrupt:\n"
        "    log(step + 1)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    marks = common.watch_run(proc, metrics, interrupt_after=2.0)
    assert proc.returncode == 0  # it caught the SIGINT and finished its step
    steps = [s for s, _ in marks]
    assert steps == sorted(set(steps)) and steps[0] >= 1 and len(steps) >= 3
    lines = metrics.read_text().splitlines()
    assert common.logged_steps(metrics) == len(lines) - 1  # the step-0 line is not counted
    # A step logged just before the exit may come after the last poll.
    assert steps[-1] in (len(lines) - 1, len(lines) - 2)
    a, b, cpu = common.steady_cpu(marks)
    # About 0.3 s of CPU a step; the step logged after SIGINT took none.
    assert 0.2 * (b - a - 1) <= cpu <= 0.3 * (b - a) + 0.3


def test_train_forward_compares_padded_and_packed_on_one_microbatch(tmp_path) -> None:
    out = tmp_path / "forward.json"
    proc = bench(
        "bench_train_forward.py", "--model", "random:qwen3-tiny", "--dtype", "bfloat16",
        "--groups", "2", "--group-size", "3", "--prompt-tokens", "12",
        "--completion-tokens", "16", "--reps", "2", "--cudnn-sdpa", "both", "--json", str(out),
    )  # fmt: skip
    result = json.loads(out.read_text())
    sides = ["padded", "packed", "padded+cudnn", "packed+cudnn"]
    assert list(result["runs"]) == sides and list(result["errors"]) == sides
    assert result["rows"] == 6 and result["real_tokens"] < result["padded_tokens"]
    for side in sides:
        assert len(result["runs"][side]) == 2 and all(r["ms"] > 0 for r in result["runs"][side])
        err = result["errors"][side]
        # bfloat16 against float32 on the same weights: close, and not identical
        assert 0 < err["logprob_err_mean"] <= err["logprob_err_max"] < 0.1
        assert 0 < err["grad_rel_err"] < 0.1
    assert "padded / packed time, paired:" in proc.stdout


def test_train_forward_on_a_machine_without_cuda_says_so_before_building_a_model() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "bench_train_forward.py"), "--device", "cuda:0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "--device cuda:0: torch" in proc.stderr
    assert "sees no CUDA GPU" in proc.stderr and "rows," not in proc.stdout
