"""GSM8K rows for online RL (GSPO, GRPO, RLOO, PPO).

    areno train --ckpt Qwen/Qwen3-0.6B --dataset-path gsm8k:main \
        --dataset-loader-fn examples/math/dataset_loader.py \
        --reward-fn-path examples/math/math_verify_reward.py --algo gspo

Row contract
    in:  ``question`` (the word problem) and ``answer`` (the worked solution, whose last line
         is ``#### <final value>``), as in the ``gsm8k`` dataset;
    out: ``prompt`` (one user message asking for a ``\\boxed{}`` answer), ``answer`` (the
         final value, thousands separators removed) and ``solutions`` (``[answer]``).

The work is done by ``areno_recipes_math.loaders.gsm8k_loader`` (the math pack's ``gsm8k``
loader, also reachable as ``--dataset-loader-fn gsm8k``). Copy this file and edit ``load_row``
to change the prompt or to read another dataset's columns.
"""

from areno_recipes_math.loaders import gsm8k_loader


def load_row(row):
    """The default function ``--dataset-loader-fn`` calls for each raw row."""
    return gsm8k_loader(row)
