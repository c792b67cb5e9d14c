"""The example commands of the ``areno train`` reference run as written, on CPU.

Each command below is the reference's, flag for flag. To run on a CPU in seconds the tests
swap the hub model for ``random:qwen3-tiny`` and hub datasets for local rows, shrink the batch
and generation sizes, and add ``--max-steps 1 --save-path``; every ``examples/...`` path is
used verbatim, from the repository root. Multi-device flags (``--world-size 8 --tp-size 4``)
need eight processes, so the runs set them to 1 (their command shape is checked by a dry run).
``--tune-params`` is dropped: its probes of 256 sequences of 32,768 tokens would take minutes
on a CPU (tests/tune runs the tuner at small sizes).

Besides the runs: the coding example's reward and agent, the alpaca loader, the game
generators' command lines and the DuelGrid web UI entry point.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from areno_core.cli.main import main
from areno_core.pyfile import load_function
from areno_core.registry import set_registry
from areno_core.testing import run_areno
from areno_core.types import RewardRecord

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
CODING = EXAMPLES / "agentic" / "coding"

# -- the reference's commands ----------------------------------------------------------------

GSPO_SMOKE = """areno train --ckpt Qwen/Qwen3-0.6B --dataset-path gsm8k:main
  --dataset-loader-fn examples/math/dataset_loader.py
  --reward-fn-path examples/math/math_verify_reward.py
  --algo gspo --tp-size 1 --world-size 1 --batch-size 1"""
GSPO_MATH = """areno train --ckpt Qwen/Qwen3-0.6B --dataset-path gsm8k:main
  --dataset-loader-fn examples/math/dataset_loader.py
  --reward-fn-path examples/math/math_verify_reward.py
  --algo gspo --tp-size 1 --world-size 1 --batch-size 2 --n-samples 2 --mini-bs 1"""
SFT_ALPACA = """areno train --ckpt Qwen/Qwen3-0.6B --dataset-path yahma/alpaca-cleaned
  --dataset-loader-fn examples/sft/alpaca/dataset_loader.py
  --algo sft --tp-size 1 --world-size 1 --batch-size 2 --mini-bs 1"""
PPO = """areno train --ckpt /path/to/policy --ref-ckpt /path/to/reference
  --reward-ckpt /path/to/reward-model --critic-ckpt /path/to/critic
  --dataset-path /path/to/data --dataset-loader-fn examples/math/dataset_loader.py
  --algo ppo --tp-size 4 --world-size 8"""
TICTACTOE_GEN = """python examples/agentic/tictactoe/dataset_generator.py
  --output /tmp/areno-tictactoe.jsonl --count 256 --seed 2026"""
TICTACTOE = """areno train --ckpt Qwen/Qwen3-0.6B --dataset-path /tmp/areno-tictactoe.jsonl
  --dataset-loader-fn examples/agentic/tictactoe/dataset_loader.py
  --reward-fn-path examples/agentic/tictactoe/reward.py
  --agent-fn examples/agentic/tictactoe/run_agent.py
  --algo gspo --tp-size 1 --world-size 1 --batch-size 32 --n-samples 8 --max-new-tokens 32"""
DUELGRID_GEN = """python examples/agentic/duelgrid/dataset_generator.py
  --count 256 --output /tmp/areno-duelgrid.jsonl"""
DUELGRID = """areno train --ckpt Qwen/Qwen3-0.6B --dataset-path /tmp/areno-duelgrid.jsonl
  --dataset-loader-fn examples/agentic/duelgrid/dataset_loader.py
  --reward-fn-path examples/agentic/duelgrid/reward.py
  --agent-fn examples/agentic/duelgrid/run_agent.py
  --algo gspo --tp-size 1 --world-size 1"""
WEB_UI = """python examples/agentic/duelgrid/web_ui.py
  --base-url http://127.0.0.1:8000/v1 --api-key EMPTY --model policy"""
CODING_AGENT = """areno train --ckpt /path/to/Qwen3.5-4B
  --dataset-path examples/agentic/coding/dataset.jsonl
  --dataset-loader-fn examples/agentic/coding/dataset_loader.py
  --reward-fn-path examples/agentic/coding/reward.py
  --agent-fn examples/agentic/coding/run_agent.py
  --algo gspo --world-size 8 --tp-size 4 --n-samples 8 --max-new-tokens 2048
  --max-context-len 32768 --tune-params --mem-frac 0.9 --tune-max-samples 256"""

TINY = "random:qwen3-tiny"
ALPACA_ROWS = [
    {"instruction": "Give three tips for staying healthy.", "input": "",
     "output": "Eat vegetables, sleep enough and walk every day."},
    {"instruction": "Translate the sentence to French.", "input": "Good morning.",
     "output": "Bonjour."},
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
    {"instruction": "Name a primary colour.", "input": "", "output": "Red."},
]  # fmt: skip


def edit(command: str, *, set_: dict[str, str] | None = None, drop: tuple[str, ...] = ()):
    """The reference ``command`` as an argv list (without the program name), with the values
    of the flags in ``set_`` replaced (or appended when the command lacks them) and the flags
    in ``drop`` removed."""
    words = shlex.split(command)
    assert words[0] in ("areno", "python"), command
    words = words[1:] if words[0] == "areno" else words[2:]
    head = [w for w in words[: words.index(next(w for w in words if w.startswith("--")))]]
    options: list[list[str]] = []
    for word in words[len(head) :]:
        if word.startswith("--"):
            options.append([word])
        else:
            options[-1].append(word)
    set_ = dict(set_ or {})
    argv = list(head)
    for flag, *value in options:
        if flag in drop:
            continue
        argv += [flag, set_.pop(flag)] if flag in set_ else [flag, *value]
    for flag, value in set_.items():
        argv += [flag, value]
    return argv


def areno(argv: list[str]) -> None:
    run_areno(*argv)


def run_script(command: str, *, set_: dict[str, str], timeout: float = 60.0):
    script = shlex.split(command)[1]
    return subprocess.run(
        [sys.executable, script, *edit(command, set_=set_)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_step(run: Path) -> dict:
    [step] = [json.loads(line) for line in (run / "tensorboard" / "metrics.jsonl").open()]
    assert step["step"] == 1
    assert (run / "latest").read_text().strip() == "step_1"
    assert (run / "step_1" / "model.safetensors").is_file()
    return step


@pytest.fixture(autouse=True)
def _from_repo_root(monkeypatch):
    """Relative ``examples/...`` paths as in the reference; installed plugins, fresh registry."""
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("ARENO_PLUGINS", raising=False)
    set_registry(None)
    yield
    set_registry(None)


@pytest.fixture(scope="module")
def gsm8k_head(tmp_path_factory) -> Path:
    src = REPO / "data" / "gsm8k" / "train.jsonl"
    if not src.is_file():
        pytest.fail(f"GSM8K rows are missing at {src}; they ship in the repository's data/gsm8k")
    path = tmp_path_factory.mktemp("gsm8k") / "train.jsonl"
    with src.open() as f:
        path.write_text("".join(next(f) for _ in range(8)))
    return path


@pytest.fixture(scope="module")
def game_data(tmp_path_factory) -> dict[str, Path]:
    """Both games' datasets, written by the example generators with the reference flags."""
    out = tmp_path_factory.mktemp("games")
    paths = {"tictactoe": out / "tictactoe.jsonl", "duelgrid": out / "duelgrid.jsonl"}
    for game, command in (("tictactoe", TICTACTOE_GEN), ("duelgrid", DUELGRID_GEN)):
        proc = run_script(command, set_={"--output": str(paths[game])})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert len(paths[game].read_text().splitlines()) == 256
    return paths


# -- the training commands, one step each ----------------------------------------------------


@pytest.mark.parametrize("command", [GSPO_SMOKE, GSPO_MATH], ids=["smoke", "gspo"])
def test_math_gspo_command_trains_one_step(tmp_path, gsm8k_head, command):
    run = tmp_path / "run"
    areno(edit(command, set_={
        "--ckpt": TINY, "--dataset-path": str(gsm8k_head), "--n-samples": "2",
        "--max-new-tokens": "16", "--max-steps": "1", "--save-path": str(run),
    }))  # fmt: skip
    step = one_step(run)
    assert step["rollout/reward_errors"] == 0
    assert 0.0 <= step["rollout/reward_mean"] <= 1.0


def test_ppo_command_with_reward_and_critic_models_trains_one_step(tmp_path, gsm8k_head):
    run = tmp_path / "run"
    areno(edit(PPO, set_={
        "--ckpt": TINY, "--ref-ckpt": TINY, "--reward-ckpt": TINY, "--critic-ckpt": TINY,
        "--dataset-path": str(gsm8k_head), "--tp-size": "1", "--world-size": "1",
        "--batch-size": "2", "--n-samples": "2", "--max-new-tokens": "16",
        "--max-steps": "1", "--save-path": str(run),
    }))  # fmt: skip
    step = one_step(run)
    assert step["rollout/samples"] == 4


def test_sft_alpaca_command_trains_one_step(tmp_path):
    data = tmp_path / "alpaca.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ALPACA_ROWS))
    run = tmp_path / "run"
    areno(edit(SFT_ALPACA, set_={
        "--ckpt": TINY, "--dataset-path": str(data), "--max-steps": "1",
        "--save-path": str(run),
    }))  # fmt: skip
    step = one_step(run)
    assert 4.0 < step["train/loss"] < 7.0  # about log(vocabulary) for a random model


@pytest.mark.parametrize("game", ["tictactoe", "duelgrid"])
def test_agentic_game_command_trains_one_step(tmp_path, game_data, game):
    run = tmp_path / "run"
    command = TICTACTOE if game == "tictactoe" else DUELGRID
    cpu = {
        "--ckpt": TINY, "--dataset-path": str(game_data[game]), "--batch-size": "2",
        "--n-samples": "2", "--max-new-tokens": "16", "--max-steps": "1",
        "--save-path": str(run),
    }  # fmt: skip
    if game == "duelgrid":
        # The byte-level tokenizer of the random model makes the map prompt ~3000 tokens.
        cpu.update({"--ckpt": f"{TINY}?max_position_embeddings=8192", "--max-context-len": "8000"})
    areno(edit(command, set_=cpu))
    step = one_step(run)
    assert step["rollout/agent_requests"] >= step["rollout/samples"] == 4
    assert step["rollout/agent_errors"] == 0
    assert 0.0 <= step["rollout/reward_mean"] <= 1.0


def test_coding_agent_command_trains_one_step(tmp_path):
    run = tmp_path / "run"
    argv = edit(CODING_AGENT, set_={
        "--ckpt": TINY, "--world-size": "1", "--tp-size": "1", "--n-samples": "2",
        "--batch-size": "2", "--max-new-tokens": "32", "--max-steps": "1",
        "--save-path": str(run),
    }, drop=("--tune-params", "--mem-frac", "--tune-max-samples"))  # fmt: skip
    areno(argv)
    step = one_step(run)
    assert step["rollout/agent_requests"] >= step["rollout/samples"] == 4
    assert step["rollout/agent_errors"] == 0
    assert step["rollout/reward_errors"] == 0
    assert step["rollout/reward_mean"] == 0.0  # a random model writes no working code


def test_coding_agent_command_unchanged_stops_on_unavailable_options(capsys):
    with pytest.raises(SystemExit) as exc:
        main(edit(CODING_AGENT, set_={"--ckpt": TINY}))
    assert exc.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    # The distributed backend would run 8 x 4, but not with --tune-params (one process's probe).
    assert (
        "Error: --world-size 8 --tp-size 4: the distributed backend cannot run this "
        "configuration: --tune-params probes one process's memory" in err
    )


def test_ppo_command_eight_processes_four_way_tensor_parallel_resolves(capsys, gsm8k_head):
    argv = edit(PPO, set_={
        "--ckpt": TINY, "--ref-ckpt": TINY, "--reward-ckpt": TINY, "--critic-ckpt": TINY,
        "--dataset-path": str(gsm8k_head),
    })  # fmt: skip
    main([*argv, "--dry-run"])
    out = capsys.readouterr().out
    assert "world_size: 8" in out and "tp_size: 4" in out
    assert "dist_timeout_s: 1800.0" in out  # the distributed backend's own options


# -- generators and the web UI ---------------------------------------------------------------


@pytest.mark.parametrize("game", ["tictactoe", "duelgrid"])
def test_generator_cli_writes_requested_count_loadable(tmp_path, game):
    out = tmp_path / f"{game}.jsonl"
    command = TICTACTOE_GEN if game == "tictactoe" else DUELGRID_GEN
    proc = run_script(command, set_={"--output": str(out), "--count": "7", "--seed": "3"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 7
    loader = load_function(
        f"examples/agentic/{game}/dataset_loader.py", default_name="load_row", what="loader"
    )
    assert all(isinstance(loader(row)["prompt"], list) for row in rows)


def test_duelgrid_web_ui_command_serves_page():
    argv = [sys.executable, *shlex.split(WEB_UI)[1:]]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert line.startswith("DuelGrid UI on http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split()[3]
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            assert "DuelGrid" in response.read().decode()
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


# -- the alpaca loader -----------------------------------------------------------------------


def test_alpaca_loader_joins_instruction_and_input():
    load_row = load_function(
        "examples/sft/alpaca/dataset_loader.py", default_name="load_row", what="loader"
    )
    assert load_row(ALPACA_ROWS[1]) == {
        "prompt": [
            {"role": "user", "content": "Translate the sentence to French.\n\nGood morning."}
        ],
        "response": "Bonjour.",
    }
    assert load_row(ALPACA_ROWS[0])["prompt"] == [
        {"role": "user", "content": "Give three tips for staying healthy."}
    ]
    assert load_row({"instruction": "x", "output": "y"})["response"] == "y"  # no input key
    assert load_row({"instruction": "x", "input": "", "output": " "}) is None


# -- the coding example ----------------------------------------------------------------------

# A correct solution for every task of dataset.jsonl, to check the hidden tests themselves.
SOLUTIONS = {
    "add_numbers": "def add_numbers(a, b):\n    return a + b\n",
    "is_palindrome": (
        "def is_palindrome(text):\n"
        "    s = [c.lower() for c in text if c.isalnum()]\n"
        "    return s == s[::-1]\n"
    ),
    "fizzbuzz": (
        "def fizzbuzz(n):\n"
        "    return ['FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0"
        " else str(i) for i in range(1, n + 1)]\n"
    ),
    "count_vowels": "def count_vowels(text):\n    return sum(c in 'aeiouAEIOU' for c in text)\n",
    "second_largest": (
        "def second_largest(numbers):\n"
        "    values = sorted(set(numbers))\n"
        "    return values[-2] if len(values) > 1 else None\n"
    ),
    "flatten": (
        "def flatten(items):\n"
        "    out = []\n"
        "    for item in items:\n"
        "        out.extend(flatten(item) if isinstance(item, list) else [item])\n"
        "    return out\n"
    ),
    "word_frequencies": (
        "def word_frequencies(text):\n"
        "    counts = {}\n"
        "    for word in text.split():\n"
        "        word = word.strip('.,!?').lower()\n"
        "        if word:\n"
        "            counts[word] = counts.get(word, 0) + 1\n"
        "    return counts\n"
    ),
    "merge_sorted": "def merge_sorted(a, b):\n    return sorted(a + b)\n",
    "is_prime": (
        "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n"
    ),
    "run_length_encode": (
        "import itertools\n"
        "def run_length_encode(text):\n"
        "    return ''.join(f'{k}{len(list(g))}' for k, g in itertools.groupby(text))\n"
    ),
    "balanced_brackets": (
        "def balanced_brackets(text):\n"
        "    pairs, stack = {')': '(', ']': '[', '}': '{'}, []\n"
        "    for c in text:\n"
        "        if c in '([{':\n"
        "            stack.append(c)\n"
        "        elif c in pairs and (not stack or stack.pop() != pairs[c]):\n"
        "            return False\n"
        "    return not stack\n"
    ),
    "fibonacci": (
        "def fibonacci(n):\n"
        "    a, b = 0, 1\n"
        "    for _ in range(n):\n"
        "        a, b = b, a + b\n"
        "    return a\n"
    ),
}


@pytest.fixture(scope="module")
def coding_rows() -> list[dict]:
    load_row = load_function(str(CODING / "dataset_loader.py"), default_name="load_row",
                             what="loader")  # fmt: skip
    raw = [json.loads(line) for line in (CODING / "dataset.jsonl").open()]
    return [load_row(row) for row in raw]


@pytest.fixture(scope="module")
def coding_reward():
    return load_function(str(CODING / "reward.py"), default_name="reward_fn", what="reward")


def _record(row: dict, completion: str) -> RewardRecord:
    return RewardRecord(prompt="", completion=completion, row=row)


def test_coding_dataset_rows_hide_tests_and_reference_solutions_pass(coding_rows, coding_reward):
    assert 8 <= len(coding_rows) <= 16
    assert sorted(r["entry_point"] for r in coding_rows) == sorted(SOLUTIONS)
    for row in coding_rows:
        roles = [m["role"] for m in row["prompt"]]
        assert roles == ["system", "user"]
        assert row["tests"].strip() not in json.dumps(row["prompt"])
        answer = f"Here it is:\n```python\n{SOLUTIONS[row['entry_point']]}```"
        assert coding_reward(_record(row, answer)) == 1.0, row["entry_point"]


def test_coding_reward_scores_wrong_looping_and_garbage_code_zero(coding_rows, coding_reward):
    from_reward = sys.modules[coding_reward.__module__]
    [row] = [r for r in coding_rows if r["entry_point"] == "add_numbers"]
    assert coding_reward(_record(row, "```py\ndef add_numbers(a, b):\n    return a - b\n```")) == 0
    assert (
        coding_reward(_record(row, "def add_numbers(a, b):\n    return a + b")) == 1.0
    )  # no fence
    thinking = "<think>```python\nx```</think>```python\ndef add_numbers(a, b): return a + b\n```"
    assert coding_reward(_record(row, thinking)) == 1.0
    for garbage in ("", "I cannot do that.", "```python\ndef add_numbers(a, b:\n```", "\x00\xff"):
        assert coding_reward(_record(row, garbage)) == 0.0
    # Leaving early must not count as passing the tests.
    for escape in ("import sys; sys.exit(0)", "import os; os._exit(0)"):
        assert coding_reward(_record(row, f"```python\n{escape}\n```")) == 0.0
    assert coding_reward(_record({}, "def add_numbers(a, b): return a + b")) == 0.0  # no tests
    assert coding_reward(RewardRecord(prompt="", completion=None, row=row)) == 0.0  # type: ignore[arg-type]
    start = time.monotonic()
    loop = "```python\ndef add_numbers(a, b):\n    while True:\n        pass\n```"
    assert coding_reward(_record(row, loop)) == 0.0
    assert time.monotonic() - start < from_reward.TIMEOUT_S + 3


class _FakeCompletions:
    """Answers like the run's endpoint: first a run_python call, then the final code."""

    def __init__(self, code: str, answer: str):
        self.requests: list[dict] = []
        self._replies = [
            {"content": "", "tool_calls": [{"id": "call_a", "type": "function", "function": {
                "name": "run_python", "arguments": json.dumps({"code": code})}}]},
            {"content": answer},
        ]  # fmt: skip

    async def create(self, **request):
        self.requests.append({**request, "messages": list(request["messages"])})
        message = {"role": "assistant", **self._replies[len(self.requests) - 1]}
        return {"choices": [{"index": 0, "message": message}]}


def test_coding_agent_runs_requested_code_and_returns_trajectory(coding_rows, coding_reward):
    from areno_core.agentic import AgentContext, AgentItem, AgentTrajectory

    agent = sys.modules[
        load_function(
            str(CODING / "run_agent.py"), default_name="run_agent", what="agent"
        ).__module__
    ]
    [row] = [r for r in coding_rows if r["entry_point"] == "fibonacci"]
    item = AgentItem(row=row, messages=tuple(row["prompt"]), prompt_index=0, sample_index=0)
    answer = f"```python\n{SOLUTIONS['fibonacci']}```"
    completions = _FakeCompletions("print(sum(range(10)))\nprint(1/0)", answer)
    client = type("Client", (), {"chat": type("Chat", (), {"completions": completions})})()
    ctx = AgentContext(base_url="http://127.0.0.1:1/v1", api_key="k")
    trajectory = asyncio.run(agent.solve(client, ctx, item))
    assert isinstance(trajectory, AgentTrajectory)
    assert len(trajectory.turns) == 2 and trajectory.metadata == {"tool_runs": 1}
    tool = trajectory.messages[-2]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_a"
    assert "exit code 1" in tool["content"] and "45" in tool["content"]
    assert "ZeroDivisionError" in tool["content"]
    assert all(r["tools"] == [agent.RUN_PYTHON_TOOL] for r in completions.requests)
    # The second request carries the first reply and the tool result, in order.
    assert [m["role"] for m in completions.requests[1]["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
    ]
    assert coding_reward(_record(row, trajectory.messages[-1]["content"])) == 1.0
