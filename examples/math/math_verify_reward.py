"""Math answer reward: 1.0 when the completion's final answer equals the reference, else 0.0.

    areno train ... --reward-fn-path examples/math/math_verify_reward.py

It reads ``record.completion`` and compares it with ``record.solutions`` / ``record.answer``
(what ``examples/math/dataset_loader.py`` puts in each row). Equivalence is decided by the
``math-verify`` library (so ``\\boxed{0.5}``, ``1/2`` and ``\\frac{1}{2}`` agree); an empty or
unparsable completion scores 0.0 and nothing raises.

The work is done by ``areno_recipes_math.reward.math_verify_reward_fn`` (the math pack's
``math_verify`` reward, also reachable as ``--reward-fn-path math_verify``).
"""

from areno_recipes_math.reward import math_verify_reward_fn


def reward_fn(record):
    """The default function ``--reward-fn-path`` calls for each sample."""
    return math_verify_reward_fn(record)
