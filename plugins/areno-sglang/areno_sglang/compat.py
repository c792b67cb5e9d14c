"""Which SGLang release areno-sglang is checked against.

``SGLANG_TESTED`` is the one line to change when moving to a newer SGLang: ``scripts/dev.sh``
installs that release's wheel (without its CUDA dependencies) into ``.cache/sglang-VERSION``,
``tests/test_sglang_types.py`` validates every request the engine sends and every answer of the
protocol server with that release's own types, and docs/rollout.md names it (a test checks).
"""

from __future__ import annotations

SGLANG_TESTED = "0.5.23"

__all__ = ["SGLANG_TESTED"]
