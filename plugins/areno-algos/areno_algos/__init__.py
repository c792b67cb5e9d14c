"""areno-algos: the built-in training algorithms of areno (sft, dpo, grpo, gspo, rloo, ppo).

Each algorithm is one module holding its config class, pure tensor functions and its
``SPEC`` (an :class:`areno_core.algorithm.AlgorithmSpec`); :mod:`areno_algos.plugin` registers
them all through the ``areno`` entry-point group.
"""

from __future__ import annotations

__version__ = "0.1.0"
