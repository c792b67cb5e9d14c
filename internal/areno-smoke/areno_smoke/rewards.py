"""The smoke reward, loaded by the recipes as a file inside this package.

It is referenced as ``resource:areno_smoke/rewards.py:digit_share_reward_fn`` (not by a
registry name) so the smoke matrix exercises that path too. Imported as a plain file, it must
not import from its own package.
"""

from __future__ import annotations

from typing import Any


def digit_share_reward_fn(record: Any) -> float:
    """The share of digits in the completion: dense, in [0, 1], and climbable by a random model."""
    text = getattr(record, "completion", "") or ""
    return sum(c.isdigit() for c in text) / max(len(text), 1)
