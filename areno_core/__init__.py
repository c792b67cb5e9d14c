"""areno: post-training for language models (SFT, DPO, GRPO, GSPO, RLOO, PPO, agentic RL).

A plugin needs at most three names from here: ``Pack`` to declare the tables it registers
(loaders, rewards, agents, recipes, specs), ``hookimpl`` to mark hook implementations written
as functions, and ``option`` to declare the run options of its algorithm, rollout engine or
backend.
"""

from __future__ import annotations

from areno_core.hookspecs import hookimpl
from areno_core.options import option
from areno_core.pack import Pack

__version__ = "0.1.0"

__all__ = ["Pack", "__version__", "hookimpl", "option"]
