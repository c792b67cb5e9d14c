"""Multi-digit arithmetic: a math task small enough to learn on two CPU cores.

A problem is ``a+b`` or ``a-b`` with two-digit operands by default (``a >= b`` for
subtraction, so answers are never negative). The prompt is the plain text ``"47+89="`` and the
expected completion is the answer's digits followed by the end-of-sequence token (``"136"``), so the
byte-level tokenizer of ``random:`` models reads one digit per token.

Regenerate the files shipped in ``areno_recipes_math/data/`` (byte-identical for the same
arguments)::

    python -m areno_recipes_math.arith --out plugins/areno-recipes-math/areno_recipes_math/data

The held-out evaluation split is drawn first and no training problem repeats one of its
``(a, op, b)`` triples.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

OPS: tuple[str, ...] = ("+", "-")
TRAIN_FILE = "arith_train.jsonl"
EVAL_FILE = "arith_eval.jsonl"


@attrs.frozen
class ArithProblem:
    a: int
    op: str
    b: int

    @property
    def question(self) -> str:
        return f"{self.a}{self.op}{self.b}"

    @property
    def answer(self) -> str:
        return str(self.a + self.b if self.op == "+" else self.a - self.b)

    def row(self) -> dict[str, Any]:
        return {"question": self.question, "answer": self.answer}


def _operand(rng: random.Random, min_digits: int, max_digits: int) -> int:
    # Pick the digit count first, so short operands are as common as long ones.
    digits = rng.randint(min_digits, max_digits)
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


def sample_problems(
    seed: int, *, min_digits: int = 2, max_digits: int = 2
) -> Iterator[ArithProblem]:
    """An endless, deterministic stream of problems for ``seed`` (repeats are possible)."""
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
    rng = random.Random(seed)
    while True:
        op = rng.choice(OPS)
        a, b = _operand(rng, min_digits, max_digits), _operand(rng, min_digits, max_digits)
        if op == "-" and a < b:
            a, b = b, a
        yield ArithProblem(a, op, b)


def count_problems(*, min_digits: int = 2, max_digits: int = 2) -> int:
    """How many distinct problems the generator can produce."""
    low = 0 if min_digits == 1 else 10 ** (min_digits - 1)
    operands = 10**max_digits - low
    return operands * operands + operands * (operands + 1) // 2  # a+b, and a-b with a >= b


def make_splits(
    *,
    seed: int = 0,
    n_train: int = 10000,
    n_eval: int = 500,
    min_digits: int = 2,
    max_digits: int = 2,
) -> tuple[list[ArithProblem], list[ArithProblem]]:
    """``(train, eval)``: unique problems each, and no evaluation problem in train."""
    available = count_problems(min_digits=min_digits, max_digits=max_digits)
    if n_train + n_eval > available:
        raise ValueError(
            f"{n_train} + {n_eval} problems asked for, but only {available} distinct problems "
            f"have {min_digits}- to {max_digits}-digit operands"
        )
    stream = sample_problems(seed, min_digits=min_digits, max_digits=max_digits)
    seen: set[ArithProblem] = set()
    splits: list[list[ArithProblem]] = []
    for size in (n_eval, n_train):
        split: list[ArithProblem] = []
        for problem in stream:
            if len(split) == size:
                break
            if problem not in seen:
                seen.add(problem)
                split.append(problem)
        splits.append(split)
    eval_split, train_split = splits
    return train_split, eval_split


def write_jsonl(problems: list[ArithProblem], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for problem in problems:
            f.write(json.dumps(problem.row(), separators=(",", ":")) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the JSONL files")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-train", type=int, default=10000)
    parser.add_argument("--n-eval", type=int, default=500)
    parser.add_argument("--min-digits", type=int, default=2)
    parser.add_argument("--max-digits", type=int, default=2)
    args = parser.parse_args(argv)
    train, held_out = make_splits(
        seed=args.seed,
        n_train=args.n_train,
        n_eval=args.n_eval,
        min_digits=args.min_digits,
        max_digits=args.max_digits,
    )
    write_jsonl(train, args.out / TRAIN_FILE)
    write_jsonl(held_out, args.out / EVAL_FILE)


if __name__ == "__main__":
    main()
