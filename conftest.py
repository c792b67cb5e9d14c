"""Settings for the whole test suite (tests/, plugins/*/tests, internal/*/tests).

Under pytest-xdist (``ARENO_TEST_WORKERS=2 bash scripts/dev.sh test``, or ``pytest -n 2``)
each worker uses one torch thread, and so does every process a test starts (unless the test
sets its own thread count): two workers with torch's default of one thread per core would ask
a 2-core machine for four, and oversubscribed OpenMP threads slow each other down.
"""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # a plain (single-process) run keeps torch's default
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    import torch  # every worker imports it for the tests anyway

    torch.set_num_threads(1)
