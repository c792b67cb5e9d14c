"""The oneDNN kernel caches are bounded by default, and that keeps bfloat16 memory flat."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from areno_core.accel.precision import cpu_has_bf16
from areno_core.models.kernel_caches import (
    CACHE_CAPACITY,
    CAPACITY_VARIABLES,
    bound_kernel_caches,
)


@pytest.fixture
def unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CAPACITY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_sets_both_capacities_when_unset(unset: None) -> None:
    values = bound_kernel_caches()
    assert values == {name: str(CACHE_CAPACITY) for name in CAPACITY_VARIABLES}
    assert all(os.environ[name] == str(CACHE_CAPACITY) for name in CAPACITY_VARIABLES)


def test_keeps_what_the_user_set(unset: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "1024")
    values = bound_kernel_caches()
    assert values["LRU_CACHE_CAPACITY"] == "1024"
    assert values["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(CACHE_CAPACITY)


def test_refuses_an_empty_cache(unset: None) -> None:
    with pytest.raises(ValueError, match="at least 1, got 0"):
        bound_kernel_caches(0)
    assert not any(name in os.environ for name in CAPACITY_VARIABLES)


def _fresh(code: str, env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in CAPACITY_VARIABLES}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_the_command_and_model_loading_set_them() -> None:
    """Both ways into a run bound the caches before any model computes: the ``areno`` command
    at import, ``load_model`` for the Python API."""
    read = f"print(json.dumps([os.environ.get(n) for n in {CAPACITY_VARIABLES!r}]))"
    cli = _fresh(f"import json, os\nimport areno_core.cli.main\n{read}", {})
    assert json.loads(cli) == [str(CACHE_CAPACITY)] * 2
    api = _fresh(
        "import json, os\nfrom areno_core.models import load_model\n"
        f"load_model('random:qwen3-tiny')\n{read}",
        {},
    )
    assert json.loads(api) == [str(CACHE_CAPACITY)] * 2


# Products of one weight for 160 different row counts, forward and backward, as areno's packed
# and length-cut microbatches produce them; RSS growth in MiB from the 60th to the last (by
# then 32-entry caches are full, 1,024-entry ones are not).
GROWTH = """
import os, random, torch
torch.set_num_threads(1)
if os.environ.get("BOUND"):
    from areno_core.models.kernel_caches import bound_kernel_caches
    bound_kernel_caches()
def rss():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024
w = torch.randn(1152, 512, dtype=torch.bfloat16, requires_grad=True)
random.seed(0)
for i in range(160):
    x = torch.randn(random.randint(200, 2000), 512, dtype=torch.bfloat16, requires_grad=True)
    (x @ w.t()).float().sum().backward()
    w.grad = None
    if i == 59:
        first = rss()
print(rss() - first)
"""


@pytest.mark.skipif(
    not cpu_has_bf16() or not os.path.exists("/proc/self/status"),
    reason="needs a CPU with bfloat16 instructions (torch runs bfloat16 products through "
    "oneDNN only there) and /proc",
)
def test_bfloat16_products_of_new_shapes_do_not_grow_memory() -> None:
    bounded = float(_fresh(GROWTH, {"BOUND": "1"}))
    default = float(
        _fresh(GROWTH, {name: "1024" for name in CAPACITY_VARIABLES})  # torch's defaults
    )
    # Measured on an AVX512-BF16 EPYC: 4-12 MiB bounded, 215-222 MiB with 1,024 entries.
    assert bounded < 50, f"bounded caches grew {bounded:.0f} MiB"
    assert default > bounded + 100, (
        f"torch's default caches grew {default:.0f} MiB, bounded {bounded:.0f}: the premise "
        "(kernels cached per shape hold memory) no longer holds"
    )
