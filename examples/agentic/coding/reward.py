"""Coding reward: 1.0 when the model's final code passes the row's hidden tests, else 0.0.

    areno train ... --reward-fn-path examples/agentic/coding/reward.py

It takes the last ```python (or bare ```) block of the final reply (``record.completion``,
``<think>`` blocks removed), or the whole reply when it has no code block, and runs it
followed by ``record.row["tests"]`` in a fresh ``python -I`` subprocess in a temporary
directory, with a ``TIMEOUT_S`` second limit (see ``coding_sandbox.py`` for the isolation and
its limits). Anything that goes wrong (no code, a syntax error, a failing or crashing test, a
timeout, a row without tests) scores 0.0; the function never raises.
"""

import re

from areno_recipes_agentic.toolcalls import answer_text
from coding_sandbox import run_python

TIMEOUT_S = 5.0
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.S | re.I)


def extract_code(text):
    """The last fenced code block of ``text``, else ``text`` itself (stripped)."""
    blocks = _FENCE.findall(text or "")
    return (blocks[-1] if blocks else text or "").strip()


def reward_fn(record):
    """The default function ``--reward-fn-path`` calls for each sample."""
    try:
        tests = record.row.get("tests")
        code = extract_code(answer_text(record))
        if not isinstance(tests, str) or not tests.strip() or not code:
            return 0.0
        return 1.0 if run_python(code, tests, timeout_s=TIMEOUT_S).passed else 0.0
    except Exception:  # a reward must never take the run down
        return 0.0
