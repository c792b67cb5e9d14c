"""DuelGrid: a small, deterministic, turn-based grid duel between two units.

The board is an N x N grid (7 x 7 by default). Row 0 is the top row and column 0 the left
column; ``up`` lowers the row number, ``left`` lowers the column number. Tiles are floor,
walls (``#``, impassable, block line of sight), traps (``^``, hurt a unit every time it steps
on them) or hold a pickup (``H`` health, ``E`` energy) until a unit collects it.

Two units fight: ``A`` (the agent, the model) and ``U`` (the user or a scripted opponent). Each
has hit points, energy and a shield flag. On its turn a unit spends energy on a sequence of
actions:

==============  ======  ==========================================================
action          energy  effect
==============  ======  ==========================================================
MOVE direction  1       step one tile; not into a wall, the other unit or off the map
ATTACK          2       3 damage to the other unit when it is orthogonally adjacent
RANGED_ATTACK   3       2 damage to the other unit in the same row or column, at most
                        3 tiles away, with no wall between them
PICKUP          1       collect the pickup on the unit's tile: H heals 3, E gives 3
                        energy (neither above its maximum)
SHIELD          2       raise a shield that halves (rounding down) the next damage
                        the unit takes, from any source; not while one is up
==============  ======  ==========================================================

(The numbers are the defaults of :class:`Rules`; a state carries its own rules.)

An action the unit cannot do (too little energy, blocked, no target, malformed) is rejected
with a reason: it changes nothing and the rest of the sequence is skipped. When a unit's hit
points reach 0 the game is over and the remaining actions are skipped. At the start of each
turn the unit to move gains ``energy_per_turn`` energy, up to ``max_energy``; generated states
start with that refill already done. Nothing here is random.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

AGENT = "A"
USER = "U"
UNITS = (AGENT, USER)
DIRECTIONS: Mapping[str, tuple[int, int]] = {
    "up": (-1, 0),
    "down": (1, 0),
    "left": (0, -1),
    "right": (0, 1),
}
ACTION_TYPES = ("MOVE", "ATTACK", "RANGED_ATTACK", "PICKUP", "SHIELD")
ITEM_KINDS = ("health", "energy")
ITEM_SYMBOLS = {"health": "H", "energy": "E"}
MIN_SIZE, MAX_SIZE = 3, 15

Pos = tuple[int, int]


class ActionRejected(ValueError):
    """An action that cannot be applied; the message is the reason shown to the player."""


@attrs.frozen
class Rules:
    """The numbers of the game. Every field is a non-negative integer."""

    move_cost: int = 1
    attack_cost: int = 2
    attack_damage: int = 3
    ranged_cost: int = 3
    ranged_damage: int = 2
    ranged_range: int = 3
    pickup_cost: int = 1
    shield_cost: int = 2
    trap_damage: int = 2
    health_restore: int = 3
    energy_restore: int = 3
    energy_per_turn: int = 4
    max_energy: int = 6
    max_hp: int = 10
    max_actions: int = 8
    max_turns: int = 60


class _OnTile:
    """A thing standing on the tile (``row``, ``col``); ``pos`` is that tile."""

    __slots__ = ()
    row: int
    col: int

    @property
    def pos(self) -> Pos:
        return (self.row, self.col)


@attrs.frozen
class Unit(_OnTile):
    """One unit: where it stands, its hit points and energy, and whether its shield is up."""

    name: str
    row: int
    col: int
    hp: int
    energy: int
    shielded: bool = False


@attrs.frozen
class Item(_OnTile):
    """A pickup lying on a tile."""

    row: int
    col: int
    kind: str


@attrs.frozen
class Action:
    """One parsed action; ``direction`` is set only for MOVE."""

    type: str
    direction: str | None = None

    def to_dict(self) -> dict[str, str]:
        out = {"type": self.type}
        if self.direction is not None:
            out["direction"] = self.direction
        return out


@attrs.frozen
class Event:
    """Something that happened while applying actions.

    ``kind`` is one of ``move``, ``trap``, ``attack``, ``ranged_attack``, ``shield``,
    ``shield_absorbed``, ``pickup``, ``defeated``, ``invalid`` (a rejected action; ``text`` is
    the reason) and ``skipped`` (actions not applied because the game ended). ``unit`` is the
    unit the event is about, ``index`` the position of the action in the sequence, ``amount``
    a damage, healing or energy figure where one applies, ``energy`` the energy spent, and
    ``pos`` the tile a ``move`` ended on.
    """

    kind: str
    unit: str
    index: int
    text: str
    amount: int = 0
    energy: int = 0
    pos: Pos | None = None

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class GameState:
    """A whole DuelGrid position. Immutable: every change makes a new state."""

    size: int
    walls: frozenset[Pos]
    traps: frozenset[Pos]
    items: tuple[Item, ...]
    agent: Unit
    user: Unit
    to_move: str = AGENT
    turn: int = 1
    rules: Rules = Rules()

    def unit(self, name: str) -> Unit:
        if name == AGENT:
            return self.agent
        if name == USER:
            return self.user
        raise ValueError(f"unknown unit {name!r}; expected one of {UNITS}")

    def other(self, name: str) -> Unit:
        return self.unit(opponent_of(name))

    def with_unit(self, unit: Unit) -> GameState:
        if unit.name == AGENT:
            return attrs.evolve(self, agent=unit)
        return attrs.evolve(self, user=unit)

    def item_at(self, pos: Pos) -> Item | None:
        for item in self.items:
            if item.pos == pos:
                return item
        return None

    def in_bounds(self, pos: Pos) -> bool:
        return 0 <= pos[0] < self.size and 0 <= pos[1] < self.size

    @property
    def winner(self) -> str | None:
        """The surviving unit once one is down to 0 hit points, else None."""
        if self.user.hp <= 0 < self.agent.hp:
            return AGENT
        if self.agent.hp <= 0 < self.user.hp:
            return USER
        return None

    @property
    def is_over(self) -> bool:
        return self.agent.hp <= 0 or self.user.hp <= 0 or self.turn > self.rules.max_turns


def opponent_of(name: str) -> str:
    if name not in UNITS:
        raise ValueError(f"unknown unit {name!r}; expected one of {UNITS}")
    return USER if name == AGENT else AGENT


# -- actions ------------------------------------------------------------------------------


def parse_action(raw: Any) -> Action:
    """An :class:`Action` from a dict like ``{"type": "MOVE", "direction": "up"}``.

    Type and direction are case-insensitive; other keys are ignored. Raises
    :class:`ActionRejected` with a readable reason for anything else.
    """
    if isinstance(raw, Action):
        return raw
    if not isinstance(raw, Mapping):
        raise ActionRejected(f"an action must be an object, got {type(raw).__name__}")
    kind = raw.get("type")
    if not isinstance(kind, str) or kind.strip().upper() not in ACTION_TYPES:
        raise ActionRejected(
            f"unknown action type {_short(kind)}; expected one of {', '.join(ACTION_TYPES)}"
        )
    kind = kind.strip().upper()
    if kind != "MOVE":
        return Action(kind)
    direction = raw.get("direction")
    if not isinstance(direction, str) or direction.strip().lower() not in DIRECTIONS:
        raise ActionRejected(
            f"MOVE needs a direction among {', '.join(DIRECTIONS)}, got {_short(direction)}"
        )
    return Action(kind, direction.strip().lower())


def apply_actions(
    state: GameState, unit: str, actions: Sequence[Any]
) -> tuple[GameState, list[Event]]:
    """Apply ``unit``'s action sequence to ``state``; return the new state and what happened.

    Actions are dicts (see :func:`parse_action`) or :class:`Action` objects. The first action
    that cannot be applied is reported as an ``invalid`` event and stops the sequence; the
    state keeps every earlier action's effect and none of the rejected one's. ``unit`` must
    be the unit to move. Turn bookkeeping (refill, handing over) is :func:`end_turn`'s job.
    """
    opponent_of(unit)  # validates the name
    events: list[Event] = []
    if not isinstance(actions, Sequence) or isinstance(actions, str | bytes):
        events.append(Event("invalid", unit, 0, "the actions must be a list"))
        return state, events
    for index, raw in enumerate(actions):
        if state.is_over:
            left = len(actions) - index
            events.append(Event("skipped", unit, index, f"game over; {left} action(s) skipped"))
            break
        try:
            if state.to_move != unit:
                raise ActionRejected(f"it is {state.to_move}'s turn, not {unit}'s")
            if index >= state.rules.max_actions:
                raise ActionRejected(
                    f"at most {state.rules.max_actions} actions are allowed per turn"
                )
            action = parse_action(raw)
            state, new_events = _apply_one(state, unit, action, index)
        except ActionRejected as exc:
            events.append(Event("invalid", unit, index, str(exc)))
            break
        events.extend(new_events)
    return state, events


def end_turn(state: GameState) -> GameState:
    """Hand the turn to the other unit, which gains its per-turn energy."""
    nxt = opponent_of(state.to_move)
    unit = state.unit(nxt)
    rules = state.rules
    refilled = attrs.evolve(
        unit, energy=max(unit.energy, min(rules.max_energy, unit.energy + rules.energy_per_turn))
    )
    return attrs.evolve(state.with_unit(refilled), to_move=nxt, turn=state.turn + 1)


def _apply_one(
    state: GameState, name: str, action: Action, index: int
) -> tuple[GameState, list[Event]]:
    rules = state.rules
    me = state.unit(name)
    foe = state.other(name)
    cost = {
        "MOVE": rules.move_cost,
        "ATTACK": rules.attack_cost,
        "RANGED_ATTACK": rules.ranged_cost,
        "PICKUP": rules.pickup_cost,
        "SHIELD": rules.shield_cost,
    }[action.type]
    if me.energy < cost:
        raise ActionRejected(f"{action.type} costs {cost} energy but {name} has {me.energy}")
    paid = attrs.evolve(me, energy=me.energy - cost)

    if action.type == "MOVE":
        assert action.direction is not None
        dr, dc = DIRECTIONS[action.direction]
        target = (me.row + dr, me.col + dc)
        if not state.in_bounds(target):
            raise ActionRejected(f"cannot move {action.direction} from {me.pos}: edge of the map")
        if target in state.walls:
            raise ActionRejected(f"cannot move {action.direction} into the wall at {target}")
        if target == foe.pos:
            raise ActionRejected(f"cannot move {action.direction}: {foe.name} stands at {target}")
        moved = attrs.evolve(paid, row=target[0], col=target[1])
        state = state.with_unit(moved)
        text = f"{name} moved {action.direction} to {target}"
        events = [Event("move", name, index, text, 0, cost, target)]
        if target in state.traps:
            state, hurt = _damage(state, name, rules.trap_damage, index, "trap")
            events.extend(hurt)
        return state, events

    if action.type == "ATTACK":
        if _manhattan(me.pos, foe.pos) != 1:
            raise ActionRejected(f"ATTACK needs {foe.name} on an adjacent tile")
        return _strike(state, paid, foe.name, "attack", rules.attack_damage, index, cost)

    if action.type == "RANGED_ATTACK":
        if me.row != foe.row and me.col != foe.col:
            raise ActionRejected(f"RANGED_ATTACK needs {foe.name} in the same row or column")
        distance = _manhattan(me.pos, foe.pos)
        if distance > rules.ranged_range:
            raise ActionRejected(
                f"RANGED_ATTACK reaches {rules.ranged_range} tiles; {foe.name} is {distance} away"
            )
        blocker = line_of_sight_blocker(state, me.pos, foe.pos)
        if blocker is not None:
            raise ActionRejected(f"RANGED_ATTACK has no line of sight: wall at {blocker}")
        return _strike(state, paid, foe.name, "ranged_attack", rules.ranged_damage, index, cost)

    if action.type == "PICKUP":
        item = state.item_at(me.pos)
        if item is None:
            raise ActionRejected(f"there is no pickup on {name}'s tile {me.pos}")
        if item.kind == "health":
            after = attrs.evolve(paid, hp=min(rules.max_hp, paid.hp + rules.health_restore))
            gained = after.hp - paid.hp
        else:
            after = attrs.evolve(
                paid, energy=min(rules.max_energy, paid.energy + rules.energy_restore)
            )
            gained = after.energy - paid.energy
        items = tuple(i for i in state.items if i is not item)
        state = attrs.evolve(state.with_unit(after), items=items)
        text = f"{name} picks up {item.kind} (+{gained})"
        return state, [Event("pickup", name, index, text, gained, cost)]

    # SHIELD
    if me.shielded:
        raise ActionRejected(f"{name}'s shield is already up")
    state = state.with_unit(attrs.evolve(paid, shielded=True))
    return state, [Event("shield", name, index, f"{name} raises a shield", 0, cost)]


def _damage(
    state: GameState, name: str, amount: int, index: int, source: str
) -> tuple[GameState, list[Event]]:
    """Deal ``amount`` damage to unit ``name`` (its shield halves it and goes down)."""
    unit = state.unit(name)
    events: list[Event] = []
    if unit.shielded:
        taken = amount // 2
        text = f"{name}'s shield absorbs {amount - taken}"
        events.append(Event("shield_absorbed", name, index, text, amount - taken))
        unit = attrs.evolve(unit, shielded=False)
    else:
        taken = amount
    lost = min(unit.hp, taken)
    unit = attrs.evolve(unit, hp=unit.hp - lost)
    state = state.with_unit(unit)
    kind = "trap" if source == "trap" else "damage"
    events.append(Event(kind, name, index, f"{name} takes {lost} damage ({source})", lost))
    if unit.hp <= 0:
        events.append(Event("defeated", name, index, f"{name} is defeated"))
    return state, events


_STRIKE_VERBS = {"attack": "attacks", "ranged_attack": "shoots"}


def _strike(
    state: GameState, paid: Unit, foe: str, kind: str, amount: int, index: int, cost: int
) -> tuple[GameState, list[Event]]:
    """``paid`` (the attacker, its energy spent) hits ``foe`` for ``amount``: the attack's
    event, carrying the damage actually dealt, then the damage's events."""
    state, hurt = _damage(state.with_unit(paid), foe, amount, index, kind)
    dealt = sum(e.amount for e in hurt if e.kind == "damage")
    text = f"{paid.name} {_STRIKE_VERBS[kind]} {foe}"
    return state, [Event(kind, paid.name, index, text, dealt, cost), *hurt]


def line_of_sight_blocker(state: GameState, start: Pos, end: Pos) -> Pos | None:
    """The first wall strictly between two tiles of one row or column, or None."""
    if start[0] != end[0] and start[1] != end[1]:
        return None
    dr = (end[0] > start[0]) - (end[0] < start[0])
    dc = (end[1] > start[1]) - (end[1] < start[1])
    pos = (start[0] + dr, start[1] + dc)
    while pos != end:
        if pos in state.walls:
            return pos
        pos = (pos[0] + dr, pos[1] + dc)
    return None


def path_distance(
    state: GameState, start: Pos, goal: Pos, *, avoid: Iterable[Pos] = ()
) -> int | None:
    """Fewest steps from ``start`` to ``goal`` around walls, units and ``avoid`` tiles.

    The goal itself is always enterable (so the distance to a unit is to its tile); None when
    there is no path.
    """
    return _bfs(state, start, goal, frozenset(avoid))[0]


def first_step(state: GameState, start: Pos, goal: Pos, *, avoid: Iterable[Pos] = ()) -> str | None:
    """The direction of the first step of a shortest path (ties: up, down, left, right)."""
    return _bfs(state, start, goal, frozenset(avoid))[1]


def _bfs(
    state: GameState, start: Pos, goal: Pos, avoid: frozenset[Pos]
) -> tuple[int | None, str | None]:
    if start == goal:
        return 0, None
    blocked = state.walls | avoid | {state.agent.pos, state.user.pos}
    first: dict[Pos, str | None] = {start: None}
    dist = {start: 0}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        for direction, (dr, dc) in DIRECTIONS.items():
            nxt = (pos[0] + dr, pos[1] + dc)
            if nxt in dist or not state.in_bounds(nxt):
                continue
            if nxt != goal and nxt in blocked:
                continue
            dist[nxt] = dist[pos] + 1
            first[nxt] = first[pos] or direction
            if nxt == goal:
                return dist[nxt], first[nxt]
            queue.append(nxt)
    return None, None


def _manhattan(a: Pos, b: Pos) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# -- rendering ----------------------------------------------------------------------------


def state_to_text(state: GameState, *, viewer: str | None = AGENT) -> str:
    """The state as an ASCII map with coordinates, a legend and both units' stats."""
    header = "    " + " ".join(str(c % 10) for c in range(state.size))
    lines = [f"Turn {state.turn}, {state.to_move} to move.", "", header]
    for r in range(state.size):
        cells = [_symbol(state, (r, c)) for c in range(state.size)]
        lines.append(f"{r:>2}  " + " ".join(cells))
    lines += [
        "",
        "Legend: A and U units, # wall, ^ trap, H health pickup, E energy pickup, . floor.",
        "Rows count down from 0 at the top; columns count right from 0 at the left.",
    ]
    rules = state.rules
    for unit in (state.agent, state.user):
        label = unit.name
        if viewer is not None:
            label += " (you)" if unit.name == viewer else " (opponent)"
        standing = ""
        item = state.item_at(unit.pos)
        if item is not None:
            standing = f", standing on a {item.kind} pickup"
        elif unit.pos in state.traps:
            standing = ", standing on a trap"
        lines.append(
            f"{label}: row {unit.row}, col {unit.col}, hp {unit.hp}/{rules.max_hp}, "
            f"energy {unit.energy}/{rules.max_energy}, shield {'up' if unit.shielded else 'down'}"
            f"{standing}"
        )
    if state.is_over:
        lines.append(f"The game is over; winner: {state.winner or 'none'}.")
    return "\n".join(lines)


def _symbol(state: GameState, pos: Pos) -> str:
    if pos == state.agent.pos:
        return AGENT
    if pos == state.user.pos:
        return USER
    if pos in state.walls:
        return "#"
    item = state.item_at(pos)
    if item is not None:
        return ITEM_SYMBOLS[item.kind]
    if pos in state.traps:
        return "^"
    return "."


# -- serialisation ------------------------------------------------------------------------


def state_to_dict(state: GameState) -> dict[str, Any]:
    """A JSON-ready dict of ``state``; :func:`state_from_dict` reads it back."""
    return {
        "size": state.size,
        "walls": [list(p) for p in sorted(state.walls)],
        "traps": [list(p) for p in sorted(state.traps)],
        "items": [{"row": i.row, "col": i.col, "kind": i.kind} for i in state.items],
        "units": {
            u.name: {
                "row": u.row,
                "col": u.col,
                "hp": u.hp,
                "energy": u.energy,
                "shielded": u.shielded,
            }
            for u in (state.agent, state.user)
        },
        "to_move": state.to_move,
        "turn": state.turn,
        "rules": attrs.asdict(state.rules),
    }


def state_from_dict(data: Any) -> GameState:
    """Read and check a state dict; ValueError says what is wrong.

    ``rules`` may be partial (missing numbers take their defaults); ``to_move`` defaults to
    ``A``, ``turn`` to 1, ``shielded`` to false.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"a DuelGrid state must be an object, got {type(data).__name__}")
    size = _int(data.get("size"), "size")
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise ValueError(f"size must be between {MIN_SIZE} and {MAX_SIZE}, got {size}")
    rules = _rules(data.get("rules") or {})

    def cell(value: Any, what: str) -> Pos:
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise ValueError(f"{what} must be a [row, col] pair, got {_short(value)}")
        pos = (_int(value[0], what), _int(value[1], what))
        if not (0 <= pos[0] < size and 0 <= pos[1] < size):
            raise ValueError(f"{what} {list(pos)} is outside the {size}x{size} map")
        return pos

    walls = frozenset(cell(p, "wall") for p in _list(data.get("walls", []), "walls"))
    traps = frozenset(cell(p, "trap") for p in _list(data.get("traps", []), "traps"))
    if walls & traps:
        raise ValueError(f"tiles {sorted(walls & traps)} are both wall and trap")
    items: list[Item] = []
    for raw in _list(data.get("items", []), "items"):
        if not isinstance(raw, Mapping):
            raise ValueError(f"an item must be an object, got {_short(raw)}")
        row, col = cell([raw.get("row"), raw.get("col")], "item")
        kind = raw.get("kind")
        if kind not in ITEM_KINDS:
            raise ValueError(f"item kind must be one of {ITEM_KINDS}, got {_short(kind)}")
        if (row, col) in walls:
            raise ValueError(f"item at {[row, col]} is inside a wall")
        if any(i.pos == (row, col) for i in items):
            raise ValueError(f"two items on tile {[row, col]}")
        items.append(Item(row, col, kind))

    units_raw = data.get("units")
    if not isinstance(units_raw, Mapping) or set(units_raw) != set(UNITS):
        raise ValueError(f"units must be an object with exactly the keys {list(UNITS)}")
    units: dict[str, Unit] = {}
    for name in UNITS:
        raw = units_raw[name]
        if not isinstance(raw, Mapping):
            raise ValueError(f"unit {name} must be an object")
        row, col = cell([raw.get("row"), raw.get("col")], f"unit {name}")
        if (row, col) in walls:
            raise ValueError(f"unit {name} stands inside a wall at {[row, col]}")
        hp = _int(raw.get("hp"), f"unit {name} hp")
        energy = _int(raw.get("energy"), f"unit {name} energy")
        if not 0 <= hp <= rules.max_hp:
            raise ValueError(f"unit {name} hp must be between 0 and {rules.max_hp}, got {hp}")
        if not 0 <= energy <= rules.max_energy:
            raise ValueError(
                f"unit {name} energy must be between 0 and {rules.max_energy}, got {energy}"
            )
        shielded = raw.get("shielded", False)
        if not isinstance(shielded, bool):
            raise ValueError(f"unit {name} shielded must be true or false")
        units[name] = Unit(name, row, col, hp, energy, shielded)
    if units[AGENT].pos == units[USER].pos:
        raise ValueError("both units stand on the same tile")
    to_move = data.get("to_move", AGENT)
    if to_move not in UNITS:
        raise ValueError(f"to_move must be one of {list(UNITS)}, got {_short(to_move)}")
    turn = _int(data.get("turn", 1), "turn")
    if turn < 1:
        raise ValueError(f"turn must be >= 1, got {turn}")
    return GameState(
        size=size,
        walls=walls,
        traps=traps,
        items=tuple(items),
        agent=units[AGENT],
        user=units[USER],
        to_move=to_move,
        turn=turn,
        rules=rules,
    )


def state_from_map(
    lines: Sequence[str],
    *,
    agent: Mapping[str, Any] | None = None,
    user: Mapping[str, Any] | None = None,
    to_move: str = AGENT,
    rules: Rules | None = None,
) -> GameState:
    """Build a state from an ASCII map, handy for tests and hand-made puzzles.

    ``lines`` are the rows of a square map in the symbols of :func:`state_to_text` (``A``,
    ``U``, ``#``, ``^``, ``H``, ``E``, ``.``; spaces are ignored). ``agent`` and ``user`` set
    ``hp``, ``energy`` and ``shielded`` (default: full hit points, maximum energy, no shield).
    """
    rules = rules or Rules()
    grid = [line.replace(" ", "") for line in lines]
    size = len(grid)
    if any(len(line) != size for line in grid):
        raise ValueError(f"the map must be square; row lengths {[len(x) for x in grid]}")
    symbols = {(r, c): ch for r, line in enumerate(grid) for c, ch in enumerate(line)}
    unknown = sorted({ch for ch in symbols.values()} - set("AU#^HE."))
    if unknown:
        raise ValueError(f"unknown map symbols {unknown}")
    found = {name: [p for p, ch in symbols.items() if ch == name] for name in UNITS}
    if any(len(found[name]) != 1 for name in UNITS):
        raise ValueError("the map must show exactly one A and one U")
    units = {}
    for name, extra in ((AGENT, agent), (USER, user)):
        values = {"hp": rules.max_hp, "energy": rules.max_energy, "shielded": False}
        values.update(extra or {})
        row, col = found[name][0]
        units[name] = {"row": row, "col": col, **values}
    data = {
        "size": size,
        "walls": [list(p) for p, ch in symbols.items() if ch == "#"],
        "traps": [list(p) for p, ch in symbols.items() if ch == "^"],
        "items": [
            {"row": p[0], "col": p[1], "kind": "health" if ch == "H" else "energy"}
            for p, ch in sorted(symbols.items())
            if ch in "HE"
        ],
        "units": units,
        "to_move": to_move,
        "rules": attrs.asdict(rules),
    }
    return state_from_dict(data)


def state_to_json(state: GameState) -> str:
    return json.dumps(state_to_dict(state), sort_keys=True)


def state_from_json(text: str) -> GameState:
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"a DuelGrid state must be JSON: {exc}") from exc
    return state_from_dict(data)


def _rules(raw: Any) -> Rules:
    if not isinstance(raw, Mapping):
        raise ValueError(f"rules must be an object, got {_short(raw)}")
    known = {f.name for f in attrs.fields(Rules)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unknown rules {unknown}; known: {sorted(known)}")
    values = {k: _int(v, f"rules.{k}") for k, v in raw.items()}
    negative = sorted(k for k, v in values.items() if v < 0)
    if negative:
        raise ValueError(f"rules {negative} must not be negative")
    rules = Rules(**values)
    if rules.max_hp < 1 or rules.max_actions < 1 or rules.max_turns < 1:
        raise ValueError("rules max_hp, max_actions and max_turns must be at least 1")
    return rules


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, got {_short(value)}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"{what} must be a list, got {_short(value)}")
    return list(value)


__all__ = [
    "ACTION_TYPES",
    "AGENT",
    "DIRECTIONS",
    "ITEM_KINDS",
    "UNITS",
    "USER",
    "Action",
    "ActionRejected",
    "Event",
    "GameState",
    "Item",
    "Rules",
    "Unit",
    "apply_actions",
    "end_turn",
    "first_step",
    "line_of_sight_blocker",
    "opponent_of",
    "parse_action",
    "path_distance",
    "state_from_dict",
    "state_from_json",
    "state_from_map",
    "state_to_dict",
    "state_to_json",
    "state_to_text",
]
