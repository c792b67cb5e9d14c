"""Agentic recipe pack for areno: tic-tac-toe and DuelGrid.

Each game is pure Python and deterministic: a rule engine, a dataset generator (with a CLI), a
dataset loader that turns a generated row into a chat prompt, an OpenAI tool schema for the
model's move, and a reward function that scores the move with the rule engine.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
