"""Shared plumbing for the side-by-side benchmarks in ``bench/``.

Every benchmark script runs in two roles. As the *driver* (the command a person types) it
builds the workload once (a random Qwen3 saved to a temporary directory, the prompts or rows),
then starts one child process per measured repetition, alternating the sides (areno, reference,
areno, reference, ...) so that background load on a shared machine hits both alike. As a
*child* (``--child SIDE``) it loads the saved model, runs an untimed warm-up, runs the timed
work, and prints one JSON line with its numbers and its own peak resident memory. Separate
processes keep each side's memory high-water mark its own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

RESULT_PREFIX = "BENCH_RESULT "
REPO = Path(__file__).resolve().parents[1]
GSM8K_DIR = REPO / "data" / "gsm8k"
# This checkout's packages come first, for the driver and (through PYTHONPATH) every child, so a
# script runs from a clone whether or not ``pip install -e .`` points at this directory.
SOURCE_PATHS = [
    str(path)
    for path in (REPO, *sorted((REPO / "plugins").glob("*")), REPO / "internal" / "areno-smoke")
    if path.is_dir()
]
for _path in reversed(SOURCE_PATHS):
    if _path not in sys.path:
        sys.path.insert(0, _path)


# -- the child side ---------------------------------------------------------------------------


def peak_rss_mib() -> float:
    """This process's peak resident set size so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def status_mib(field: str) -> float:
    """A ``kB`` field of /proc/self/status (VmRSS: now, VmHWM: peak), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak_rss() -> None:
    """Restart the kernel's peak-RSS mark (VmHWM) from the current RSS (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def set_threads(threads: int) -> None:
    """Give torch the same intra-op thread count on both sides."""
    import torch

    torch.set_num_threads(threads)


# ``--profile DIR`` reaches the children through this variable: their timed steps then run
# under torch.profiler (CPU operators and their memory), and each child writes its tables to DIR.
PROFILE_ENV = "ARENO_BENCH_PROFILE_DIR"
_profiler: Any = None


def start_profiler() -> None:
    """Start the operator profiler for the timed steps when the driver asked for one."""
    global _profiler
    if _profiler is not None or not os.environ.get(PROFILE_ENV):
        return
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    _profiler = torch.profiler.profile(activities=activities, profile_memory=True)
    _profiler.__enter__()


def _write_profile(name: str) -> str | None:
    """Stop the profiler and write its operator tables, by own CPU time and by own memory."""
    global _profiler
    if _profiler is None:
        return None
    _profiler.__exit__(None, None, None)
    averages = _profiler.key_averages()
    _profiler = None
    directory = Path(os.environ[PROFILE_ENV])
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{os.getpid()}.txt"
    with path.open("w") as f:
        f.write(f"# {name}: the timed steps, by own CPU time\n")
        f.write(averages.table(sort_by="self_cpu_time_total", row_limit=40) + "\n")
        f.write(f"# {name}: the timed steps, by own memory allocated\n")
        f.write(averages.table(sort_by="self_cpu_memory_usage", row_limit=25) + "\n")
    return str(path)


def emit(result: Mapping[str, Any], name: str = "child") -> None:
    """Print a child's result where the driver finds it (the last line starting with the tag)."""
    payload = {**result, "peak_rss_mib": peak_rss_mib()}
    profile = _write_profile(name)
    if profile is not None:
        payload["profile"] = profile
    sys.stdout.write(RESULT_PREFIX + json.dumps(payload) + "\n")
    sys.stdout.flush()


class StepClock:
    """Wall-clock and process CPU-time marks at the end of each step; the first ``warmup``
    steps are not timed.

    CPU time is what the process itself spent (all its threads, user + system). On a shared
    machine other processes stretch wall time but barely touch CPU time, so work per
    CPU-second is the steadier measure; both are reported.
    """

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.marks: list[tuple[float, float]] = []
        self.start = (time.perf_counter(), time.process_time())
        if warmup == 0:
            start_profiler()

    def mark(self) -> None:
        self.marks.append((time.perf_counter(), time.process_time()))
        if len(self.marks) == self.warmup:
            start_profiler()

    def _span(self, which: int) -> float:
        begin = self.marks[self.warmup - 1] if self.warmup else self.start
        return self.marks[-1][which] - begin[which]

    @property
    def timed_seconds(self) -> float:
        return self._span(0)

    @property
    def timed_cpu_seconds(self) -> float:
        return self._span(1)

    @property
    def timed_steps(self) -> int:
        return len(self.marks) - self.warmup


def rates(name: str, work: float, wall: float, cpu: float) -> dict[str, float]:
    """``{name}_per_s`` (per wall second) and ``{name}_per_cpu_s`` (per CPU second)."""
    return {f"{name}_per_s": work / wall, f"{name}_per_cpu_s": work / max(cpu, 1e-9)}


# -- the driver side --------------------------------------------------------------------------


def load_average() -> float:
    return os.getloadavg()[0]


def tree_cpu_s(pid: int) -> float | None:
    """CPU seconds used so far by process ``pid`` and every descendant (the trainer and its
    rollout worker), including their children already reaped; None without Linux's /proc."""
    proc = Path("/proc")
    if not (proc / str(pid) / "stat").is_file():
        return None
    stats: dict[int, tuple[int, list[str]]] = {}  # pid -> (parent pid, fields after the name)
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # it exited meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()
        stats[int(entry.name)] = (int(fields[1]), fields)
    tree, grew = {pid}, True
    while grew:
        found = {child for child, (parent, _) in stats.items() if parent in tree} - tree
        tree |= found
        grew = bool(found)
    ticks = os.sysconf("SC_CLK_TCK")
    # utime, stime, cutime, cstime: fields 14-17 of /proc/PID/stat (11-14 after the name).
    return sum(sum(int(v) for v in stats[p][1][11:15]) for p in tree if p in stats) / ticks


def logged_steps(metrics: Path) -> int:
    """How many training steps (step 1 on; not the step-0 evaluation) ``metrics`` holds."""
    if not metrics.is_file():
        return 0
    return sum(1 for line in metrics.read_text().splitlines() if '"step": 0' not in line)


def watch_run(
    proc: subprocess.Popen, metrics: Path, *, interrupt_after: float | None = None
) -> list[tuple[int, float]]:
    """Poll ``proc`` every 50 ms until it exits; return ``(steps logged, CPU s of its process
    tree)`` at each moment the count of steps in ``metrics`` grew (Linux: read from /proc;
    empty elsewhere). After ``interrupt_after`` seconds it sends SIGINT once: areno finishes
    the step in flight, saves it and exits. A run still alive 600 s after that is killed."""
    import signal

    started = time.perf_counter()
    marks: list[tuple[int, float]] = []
    interrupted: float | None = None
    while proc.poll() is None:
        steps = logged_steps(metrics)
        if steps > (marks[-1][0] if marks else 0):
            cpu = tree_cpu_s(proc.pid)
            if cpu is not None:
                marks.append((steps, cpu))
        now = time.perf_counter()
        if interrupt_after is not None and interrupted is None and now - started > interrupt_after:
            proc.send_signal(signal.SIGINT)
            interrupted = now
        if interrupted is not None and now - interrupted > 600:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"the run did not stop within 600 s of SIGINT: {proc.args}")
        time.sleep(0.05)
    return marks


def steady_cpu(marks: Sequence[tuple[int, float]], first: int = 2) -> tuple[int, int, float] | None:
    """The steady state in ``marks`` (from :func:`watch_run`): ``(a, b, cpu)``, where steps
    ``a + 1`` to ``b`` took ``cpu`` CPU seconds, from the moment step ``first`` (or the first
    count past it) was logged to the moment the last step was; None when fewer than two marks
    reach ``first``. The processes' start, the last save and the shutdown are left out."""
    after = [mark for mark in marks if mark[0] >= first]
    if len(after) < 2:
        return None
    (a, cpu_a), (b, cpu_b) = after[0], after[-1]
    return a, b, cpu_b - cpu_a


def machine_info(threads: int) -> dict[str, Any]:
    """What the numbers were measured on (``threads``: the torch threads each side used)."""
    import torch

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {"torch": torch.__version__}
    for name in ("transformers", "trl", "accelerate"):
        try:
            module = __import__(name)
            versions[name] = module.__version__
        except ImportError:
            versions[name] = "not installed"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch_threads": threads,
        **versions,
    }


def run_child(script: Path, args: Sequence[str], *, timeout: float | None = None) -> dict[str, Any]:
    """Run ``python script args`` and return its result JSON plus the load seen around it."""
    load_before = load_average()
    began = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO),
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": _pythonpath()},
    )
    wall = time.perf_counter() - began
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise RuntimeError(f"child {' '.join(args)} failed (rc={proc.returncode}):\n{tail}")
    result = json.loads(lines[-1][len(RESULT_PREFIX) :])
    result["load_before"] = load_before
    result["load_after"] = load_average()
    result["child_wall_s"] = wall
    return result


def _pythonpath() -> str:
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([*SOURCE_PATHS, *(p for p in inherited if p not in SOURCE_PATHS)])


def interleaved(
    sides: Sequence[str],
    reps: int,
    run_one: Callable[[str, int], dict[str, Any]],
    *,
    log: Callable[[str], None] = print,
) -> dict[str, list[dict[str, Any]]]:
    """Run ``reps`` repetitions of every side, alternating: A B A B ... (rep-major order).

    Even repetitions start with the first side and odd ones with the second, so neither side
    always runs right after the other (e.g. on a cooling or warming machine).
    """
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    for rep in range(reps):
        order = list(sides) if rep % 2 == 0 else list(reversed(sides))
        for side in order:
            result = run_one(side, rep)
            results[side].append(result)
            log(f"  rep {rep + 1}/{reps} {side:<6} " + _short(result))
    return results


def _short(result: Mapping[str, Any]) -> str:
    keys = [k for k in result if k.endswith("_per_s")][:1]
    keys += [k for k in result if k.endswith("_per_cpu_s")][:1]
    keys += ["peak_rss_mib", "load_before"]
    return " ".join(f"{k}={result[k]:.4g}" for k in keys if k in result)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def summarize(
    results: Mapping[str, Sequence[Mapping[str, Any]]], keys: Sequence[str]
) -> dict[str, dict[str, float]]:
    """Median, minimum and maximum (``KEY``, ``KEY_min``, ``KEY_max``) of each key per side,
    and the range of the load seen."""
    out: dict[str, dict[str, float]] = {}
    for side, runs in results.items():
        row: dict[str, float] = {}
        for k in keys:
            if runs and all(k in r for r in runs):
                values = [float(r[k]) for r in runs]
                row[k], row[k + "_min"], row[k + "_max"] = median(values), min(values), max(values)
        loads = [r["load_before"] for r in runs] + [r["load_after"] for r in runs]
        row["load_min"], row["load_max"] = min(loads), max(loads)
        row["reps"] = float(len(runs))
        out[side] = row
    return out


def paired_ratios(
    results: Mapping[str, Sequence[Mapping[str, Any]]], side: str, reference: str, key: str
) -> list[float]:
    """``side / reference`` for ``key``, repetition by repetition (the two runs of a pair ran
    back to back, so they saw about the same load)."""
    return [
        float(a[key]) / float(b[key])
        for a, b in zip(results[side], results[reference], strict=False)
        if key in a and key in b and float(b[key]) > 0
    ]


def spread(values: Sequence[float], unit: str = "") -> str:
    """``median (min-max)`` of ``values``, formatted for a table."""
    if not values:
        return "n/a"
    return f"{median(values):.3g}{unit} ({min(values):.3g}-{max(values):.3g})"


def ratio_lines(
    results: Mapping[str, Sequence[Mapping[str, Any]]],
    reference: str,
    keys: Sequence[tuple[str, str]],
) -> list[str]:
    """One line per other side and key: paired ratios per wall second and per CPU second."""
    lines = []
    for side in results:
        if side == reference:
            continue
        for key, label in keys:
            wall = paired_ratios(results, side, reference, f"{key}_per_s")
            cpu = paired_ratios(results, side, reference, f"{key}_per_cpu_s")
            lines.append(
                f"ratio {side}/{reference}, {label}: per CPU-second {spread(cpu, 'x')}, "
                f"per wall second {spread(wall, 'x')}"
            )
    return lines


def maybe(value: float | None, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals, or ``n/a`` for None (a reading this system lacks)."""
    return "n/a" if value is None else f"{value:.{digits}f}"


def steady_cpu_column(runs: Sequence[Mapping[str, Any]]) -> str:
    """The table cell of the runs' ``steady_cpu_s_per_sample`` (None without /proc)."""
    values = [r["steady_cpu_s_per_sample"] for r in runs]
    if any(v is None for v in values):
        return "n/a (needs /proc)"
    return spread(values)


def against(
    results: Mapping[str, Sequence[Mapping[str, Any]]],
    reference: str,
    keys: Sequence[tuple[str, str]],
) -> list[str]:
    """A line per other side: ``side / reference`` for each ``(key, label)``, run by run (rep
    ``i`` of each side ran in the same round of the alternation, so under about the same
    load); runs without a value (None) are left out of their pair."""
    if reference not in results:
        return []
    lines = [""]
    for side, runs in results.items():
        if side == reference:
            continue
        parts = []
        for key, label in keys:
            ratios = [
                float(a[key]) / float(b[key])
                for a, b in zip(runs, results[reference], strict=False)
                if a.get(key) is not None and b.get(key)
            ]
            parts.append(f"{label} {spread(ratios, 'x')}")
        lines.append(f"{side} / {reference}, paired: " + "; ".join(parts))
    return lines


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (pasted as-is into docs/performance.md)."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def wide_qwen3(layers: int) -> str:
    """The ``random:`` reference of a Qwen3 of width 768 (12 heads of 64, 4 key/value heads,
    MLP 2048) with ``layers`` decoder layers, on the 272-token byte vocabulary."""
    return (
        f"random:qwen3?hidden_size=768&num_hidden_layers={layers}&num_attention_heads=12"
        "&num_key_value_heads=4&head_dim=64&intermediate_size=2048"
    )


def save_random_model(ref: str, directory: Path) -> Path:
    """Build ``ref`` (a ``random:`` model) once and save it with its tokenizer, so both sides
    load byte-identical weights and the same tokenizer files from ``directory``."""
    from areno_core.models.scratch import build_random_model
    from areno_core.models.tokenizer import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    model = build_random_model(ref, tokenizer=tokenizer)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def read_jsonl(path: Path, limit: int | None = None, skip: int = 0) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with path.open() as f:
        for i, line in enumerate(f):
            if i < skip or not line.strip():
                continue
            rows.append(json.loads(line))
            if limit is not None and len(rows) == limit:
                break
    return rows


def trl_baseline_args(seed: int) -> dict[str, Any]:
    """The TRL trainer arguments both TRL baselines share: a constant learning rate with no
    warmup or weight decay, gradients clipped at norm 1, on the CPU without checkpointing or
    float16, and nothing logged, saved or shown (no progress bar, no loader workers)."""
    return {
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "max_grad_norm": 1.0,
        "gradient_checkpointing": False,
        "fp16": False,
        "use_cpu": True,
        "report_to": [],
        "logging_strategy": "no",
        "save_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "seed": seed,
    }


def base_parser(description: str, *, profile: bool = False) -> argparse.ArgumentParser:
    """The flags every script takes; ``profile``: also ``--profile`` (scripts whose children
    time their work with :class:`StepClock` or call :func:`start_profiler` themselves)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--reps", type=int, default=3, help="measured repetitions per side")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads on both sides (default 1: see bench/README.md)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write all results here")
    if profile:
        parser.add_argument(
            "--profile",
            type=Path,
            default=None,
            help="run the timed work under torch.profiler and write each run's operator tables "
            "(own CPU time, own memory) to this directory; the timings then include its overhead",
        )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, default=None, help=argparse.SUPPRESS)
    return parser


def run_role(
    parser: argparse.ArgumentParser,
    child: Callable[[argparse.Namespace], Mapping[str, Any]],
    drive: Callable[[argparse.Namespace], Mapping[str, Any]],
) -> None:
    """Parse the command line and play this process's role: as a child (``--child SIDE``),
    print the result line of ``child(args)``; as the driver, run ``drive(args)`` and write its
    results to ``--json`` when given."""
    args = parser.parse_args()
    if args.child:
        emit(child(args), name=args.child)
        return
    if getattr(args, "profile", None) is not None:
        os.environ[PROFILE_ENV] = str(args.profile.resolve())
    write_json(args.json, drive(args))


def write_json(path: Path | None, payload: Mapping[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2))
