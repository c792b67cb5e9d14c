"""Generate DuelGrid starting states.

Usage::

    python -m areno_recipes_agentic.duelgrid.generate --output /tmp/duelgrid.jsonl \
        --count 256 --seed 2026

Each row is ``{"id": ..., "mode": "tool", "state": {...}}`` where ``state`` is a
:func:`~areno_recipes_agentic.duelgrid.rules.state_to_dict` dict with ``A`` (the model) to move
and its turn's energy already granted. Every row has its own RNG derived from the seed and the
row number, so the first rows of a larger dataset equal a smaller one's.

What varies: wall layout (always leaving the open tiles connected), traps, health and energy
pickups, where both units stand (never adjacent; sometimes close enough to strike this turn),
their hit points and energy, and whether a shield is already up.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from typing import Any

from areno_recipes_agentic.datagen import generator_parser, write_jsonl
from areno_recipes_agentic.duelgrid.loader import MAX_ROW_TURNS
from areno_recipes_agentic.duelgrid.rules import (
    AGENT,
    MAX_SIZE,
    USER,
    GameState,
    Item,
    Pos,
    Rules,
    Unit,
    state_to_dict,
)

MODES = ("tool", "text")
MIN_GENERATED_SIZE = 5


def generate_state(rng: random.Random, size: int = 7, rules: Rules | None = None) -> GameState:
    """One random starting state drawn with ``rng``."""
    if not MIN_GENERATED_SIZE <= size <= MAX_SIZE:
        raise ValueError(f"size must be between {MIN_GENERATED_SIZE} and {MAX_SIZE}, got {size}")
    rules = rules or Rules()
    cells = [(r, c) for r in range(size) for c in range(size)]
    n_walls = rng.randint(size - 2, 2 * size - 4)
    while True:
        walls = frozenset(rng.sample(cells, n_walls))
        open_cells = [p for p in cells if p not in walls]
        if _connected(open_cells):
            break
    agent_pos, user_pos = _place_units(rng, open_cells)
    free = [p for p in open_cells if p not in (agent_pos, user_pos)]
    rng.shuffle(free)
    n_traps = rng.randint(2, size - 2)
    n_health = rng.randint(1, 2)
    n_energy = rng.randint(1, 2)
    traps = frozenset(free[:n_traps])
    spots = free[n_traps : n_traps + n_health + n_energy]
    kinds = ["health"] * n_health + ["energy"] * n_energy
    items = tuple(
        sorted(
            (Item(r, c, k) for (r, c), k in zip(spots, kinds, strict=True)),
            key=lambda i: i.pos,
        )
    )
    low_energy = min(rules.energy_per_turn, rules.max_energy)
    agent = Unit(
        AGENT,
        *agent_pos,
        hp=rng.randint(max(1, rules.max_hp // 2), rules.max_hp),
        energy=rng.randint(low_energy, rules.max_energy),
        shielded=rng.random() < 0.2,
    )
    user = Unit(
        USER,
        *user_pos,
        hp=rng.randint(max(1, rules.max_hp * 2 // 5), rules.max_hp),
        energy=rng.randint(0, rules.max_energy),
        shielded=rng.random() < 0.2,
    )
    return GameState(
        size=size, walls=walls, traps=traps, items=items, agent=agent, user=user, rules=rules
    )


def generate_states(
    count: int, seed: int, *, size: int = 7, mode: str = "tool", turns: int | None = None
) -> list[dict[str, Any]]:
    """``count`` dataset rows of random starting states; the same arguments give the same rows.

    ``turns`` (1 to 16), when given, is written into every row: how many rounds the
    ``duelgrid`` agent plays against the scripted opponent (it plays 2 when a row says nothing).
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if turns is not None and not 1 <= turns <= MAX_ROW_TURNS:
        raise ValueError(f"turns must be between 1 and {MAX_ROW_TURNS}, got {turns}")
    rows = []
    for index in range(count):
        rng = random.Random(f"duelgrid:{seed}:{index}")
        state = generate_state(rng, size)
        row_id = f"duelgrid-{seed}-{index:05d}"
        row: dict[str, Any] = {"id": row_id, "mode": mode, "state": state_to_dict(state)}
        if turns is not None:
            row["turns"] = turns
        rows.append(row)
    return rows


def _place_units(rng: random.Random, open_cells: list[Pos]) -> tuple[Pos, Pos]:
    """Two open tiles at Manhattan distance >= 2; a third of the time at most 4 apart."""
    close = rng.random() < 1 / 3
    agent = rng.choice(open_cells)
    choices = [p for p in open_cells if _far_enough(agent, p, close)]
    if not choices:  # a crowded small map: fall back to any non-adjacent tile
        choices = [p for p in open_cells if abs(agent[0] - p[0]) + abs(agent[1] - p[1]) >= 2]
    return agent, rng.choice(choices)


def _far_enough(a: Pos, b: Pos, close: bool) -> bool:
    d = abs(a[0] - b[0]) + abs(a[1] - b[1])
    return 2 <= d <= 4 if close else d >= 3


def _connected(open_cells: list[Pos]) -> bool:
    if not open_cells:
        return False
    todo = set(open_cells)
    queue = deque([open_cells[0]])
    todo.discard(open_cells[0])
    while queue:
        r, c = queue.popleft()
        for nxt in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if nxt in todo:
                todo.discard(nxt)
                queue.append(nxt)
    return not todo


def main(argv: Sequence[str] | None = None) -> int:
    parser = generator_parser(
        "python -m areno_recipes_agentic.duelgrid.generate",
        "Write random DuelGrid starting states as JSONL.",
    )
    parser.add_argument("--size", type=int, default=7, help="map side length (default 7)")
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="tool",
        help="'tool': answer with the choose_action tool; 'text': answer with JSON in the reply",
    )
    parser.add_argument(
        "--turns",
        type=int,
        default=None,
        help="rounds the duelgrid agent plays per row, 1-16 (default: not written; the agent "
        "then plays 2)",
    )
    args = parser.parse_args(argv)
    if args.count < 0:
        parser.error("--count must be >= 0")
    if not MIN_GENERATED_SIZE <= args.size <= MAX_SIZE:
        parser.error(f"--size must be between {MIN_GENERATED_SIZE} and {MAX_SIZE}")
    if args.turns is not None and not 1 <= args.turns <= MAX_ROW_TURNS:
        parser.error(f"--turns must be between 1 and {MAX_ROW_TURNS}")
    rows = generate_states(args.count, args.seed, size=args.size, mode=args.mode, turns=args.turns)
    write_jsonl(rows, args.output)
    print(f"wrote {len(rows)} DuelGrid states to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
