from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GSM8K_DIR = REPO / "data" / "gsm8k"
DIGIT_SHARE_REWARD = REPO / "tests" / "fixtures" / "digit_share_reward.py"

# A minimal algorithm plugin for core tests, independent of areno-algos.
TOY_ALGO_SOURCE = """
import attrs
from areno_core import hookimpl, option
from areno_core.algorithm import AlgorithmSpec, RowSchema


@attrs.define
class ToyConfig:
    toy_beta: float = option(0.1, "A toy coefficient the toy loss ignores.")


def _loss(outputs, batch, config):
    return (outputs["logprobs"] * 0).sum(), {}


TOY = AlgorithmSpec(
    name="toy",
    summary="a toy supervised algorithm",
    kind="supervised",
    row_schema=RowSchema(required={"prompt": (str,), "response": (str,)}),
    config_cls=ToyConfig,
    loss=_loss,
)


@hookimpl
def register_algorithms(register):
    register(TOY)


@hookimpl
def register_rewards(register):
    register("always_one", lambda record: 1.0)
"""


def _write_rl_files(folder: Path, prompt_chars: int) -> tuple[Path, Path]:
    loader, reward = folder / "rl_loader.py", folder / "reward.py"
    loader.write_text(
        "def load_row(row):\n"
        f'    return {{"prompt": row["question"][:{prompt_chars}], '
        '"answer": row["answer"].split("####")[-1].strip()}\n'
    )
    reward.write_text(DIGIT_SHARE_REWARD.read_text())
    return loader, reward


def _write_dpo_loader(folder: Path, prompt_chars: int) -> Path:
    loader = folder / "dpo_loader.py"
    loader.write_text(
        "def load_row(row):\n"
        '    final = row["answer"].split("####")[-1].strip()\n'
        f'    return {{"prompt": row["question"][:{prompt_chars}], '
        '"chosen": "It is " + final + ".", "rejected": "No."}\n'
    )
    return loader


@pytest.fixture(scope="session")
def write_rl_files() -> Callable[[Path, int], tuple[Path, Path]]:
    """``write(folder, prompt_chars)`` writes the GSM8K files of a short online run into
    ``folder`` and returns ``(loader, reward)``: ``rl_loader.py`` (the question cut to
    ``prompt_chars`` characters as the prompt, the final answer) and ``reward.py`` (the share of
    digits in the completion, tests/fixtures/digit_share_reward.py)."""
    return _write_rl_files


@pytest.fixture(scope="session")
def write_dpo_loader() -> Callable[[Path, int], Path]:
    """``write(folder, prompt_chars)`` writes ``dpo_loader.py`` into ``folder`` and returns it:
    GSM8K pairs with the question cut to ``prompt_chars`` characters, "It is <answer>." chosen
    over "No."."""
    return _write_dpo_loader


@pytest.fixture
def gsm8k_dir() -> Path:
    if not (GSM8K_DIR / "train.jsonl").is_file():
        pytest.fail(
            f"GSM8K rows are missing at {GSM8K_DIR}; they ship in the repository's data/gsm8k"
        )
    return GSM8K_DIR


@pytest.fixture
def toy_registry(install_areno_plugin, monkeypatch):
    """A registry holding only the toy algorithm plugin (other installed plugins disabled)."""
    monkeypatch.setenv("ARENO_PLUGINS", "toy_algo_pack")
    return install_areno_plugin("toy-algo-pack", "toy_algo_pack", TOY_ALGO_SOURCE)
