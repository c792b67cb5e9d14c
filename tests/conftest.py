from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
GSM8K_DIR = REPO / "data" / "gsm8k"

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


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread for a module's tests (tiny matmuls run far faster on one thread than
    with threads fighting over two cores); the thread count comes back afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


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
