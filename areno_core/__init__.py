"""areno: post-training for language models (SFT, DPO, GRPO, GSPO, RLOO, PPO, agentic RL).

A plugin needs two names from here: ``hookimpl`` to mark its hook implementations and
``option`` to declare the run options of its algorithm, rollout engine or backend.
"""

from __future__ import annotations

from areno_core.hookspecs import hookimpl
from areno_core.options import option

__version__ = "0.1.0"

__all__ = ["__version__", "hookimpl", "option"]
