"""A math reward built on math-verify: 1.0 when the completion's final answer is equivalent to
a reference, else 0.0. Malformed completions score 0.0 and never raise."""

from __future__ import annotations

import logging
import threading
from typing import Any

# math-verify enforces its timeouts with SIGALRM, which works only on the main thread. Off the
# main thread (async or threaded reward scoring) timeouts are disabled, and math-verify's
# per-call warning about that is silenced.
_TIMEOUT_S = 5


def _timeout() -> int | None:
    if threading.current_thread() is threading.main_thread():
        return _TIMEOUT_S
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return None


def _references(record: Any) -> list[str]:
    refs = [s for s in getattr(record, "solutions", ()) or () if s]
    answer = getattr(record, "answer", None)
    if answer is not None and str(answer) not in refs:
        refs.append(str(answer))
    return refs


def math_verify_reward_fn(record: Any) -> float:
    """Score ``record.completion`` against ``record.solutions`` / ``record.answer``."""
    from math_verify import parse, verify

    completion = getattr(record, "completion", "") or ""
    timeout = _timeout()
    if not completion.strip():
        return 0.0
    try:
        predicted = parse(completion, parsing_timeout=timeout)
    except Exception:  # math-verify can fail on odd LaTeX; a bad completion scores 0
        return 0.0
    if not predicted:
        return 0.0
    for ref in _references(record):
        try:
            # A bare number or expression reference is wrapped so it parses as math.
            text = ref if "\\boxed" in ref or "$" in ref else f"${ref}$"
            gold = parse(text, parsing_timeout=timeout)
            if gold and verify(gold, predicted, timeout_seconds=timeout):
                return 1.0
        except Exception:
            continue
    return 0.0


def exact_match_reward_fn(record: Any) -> float:
    """1.0 when the completion, stripped of surrounding whitespace, equals the answer."""
    completion = (getattr(record, "completion", "") or "").strip()
    answer = getattr(record, "answer", None)
    if answer is None or not completion:
        return 0.0
    return 1.0 if completion == str(answer).strip() else 0.0
