"""areno: post-training for language models (SFT, DPO, GRPO, GSPO, RLOO, PPO, agentic RL)."""

from __future__ import annotations

from areno_core.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = ["__version__", "hookimpl"]
