"""Which reasoning-gym tasks exist, without importing reasoning-gym when it can be avoided.

Importing ``reasoning_gym`` takes about 4 s (it builds every generator module), and the plugin
registers its recipes every time ``areno`` starts. For the version this pack was tested with,
the task names are the list below (``tests/test_rg_tasks.py`` checks it against the installed
package); any other installed version is imported and asked for its own list, so ``rg/<task>``
always covers exactly the tasks the installed reasoning-gym has.
"""

from __future__ import annotations

import dataclasses
import functools
from importlib import metadata
from typing import Any

from areno_core.errors import ConfigError, did_you_mean

DISTRIBUTION = "reasoning-gym"
TESTED_VERSION = "0.1.25"
INSTALL_HINT = (
    f"pip install 'areno-envs[reasoning-gym]' (tested with {DISTRIBUTION}=={TESTED_VERSION})"
)
# Options of a task's config dataclass that the pack sets itself from the spec row.
RESERVED_FIELDS = frozenset({"seed", "size"})

# reasoning_gym.factory.DATASETS of reasoning-gym 0.1.25, sorted.
TESTED_TASKS: tuple[str, ...] = (
    "ab",
    "acre",
    "advanced_geometry",
    "aiw",
    "arc_1d",
    "arc_agi",
    "base_conversion",
    "basic_arithmetic",
    "bf",
    "binary_alternation",
    "binary_matrix",
    "bitwise_arithmetic",
    "boxnet",
    "caesar_cipher",
    "calendar_arithmetic",
    "chain_sum",
    "circuit_logic",
    "codeio",
    "coin_flip",
    "color_cube_rotation",
    "complex_arithmetic",
    "composite",
    "count_bits",
    "count_primes",
    "countdown",
    "course_schedule",
    "cryptarithm",
    "decimal_arithmetic",
    "decimal_chain_sum",
    "dice",
    "emoji_mystery",
    "family_relationships",
    "figlet_font",
    "fraction_simplification",
    "futoshiki",
    "game_of_life",
    "game_of_life_halting",
    "gcd",
    "graph_color",
    "group_anagrams",
    "gsm_symbolic",
    "intermediate_integration",
    "isomorphic_strings",
    "jugs",
    "kakurasu",
    "knight_swap",
    "knights_knaves",
    "largest_island",
    "lcm",
    "leg_counting",
    "letter_counting",
    "letter_jumble",
    "list_functions",
    "mahjong_puzzle",
    "manipulate_matrix",
    "maze",
    "mini_sudoku",
    "modulo_grid",
    "n_queens",
    "needle_haystack",
    "number_filtering",
    "number_format",
    "number_sequence",
    "number_sorting",
    "palindrome_generation",
    "palindrome_partitioning",
    "path_star",
    "polynomial_equations",
    "polynomial_multiplication",
    "pool_matrix",
    "power_function",
    "prime_factorization",
    "products",
    "propositional_logic",
    "puzzle24",
    "quantum_lock",
    "ransom_note",
    "rearc",
    "rectangle_count",
    "rotate_matrix",
    "rotten_oranges",
    "rubiks_cube",
    "rush_hour",
    "self_reference",
    "sentence_reordering",
    "shortest_path",
    "simple_equations",
    "simple_geometry",
    "simple_integration",
    "sokoban",
    "spell_backward",
    "spiral_matrix",
    "string_insertion",
    "string_manipulation",
    "string_splitting",
    "string_synthesis",
    "sudoku",
    "survo",
    "syllogism",
    "time_intervals",
    "tower_of_hanoi",
    "tsumego",
    "word_ladder",
    "word_sequence_reversal",
    "word_sorting",
    "zebra_puzzles",
)


def installed_version() -> str | None:
    """The installed reasoning-gym's version, or None when it is not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def task_names() -> tuple[str, ...]:
    """Every task of the installed reasoning-gym; the tested version's tasks when it is not
    installed (their recipes are listed, and a run says how to install it before any model
    loads)."""
    version = installed_version()
    if version is None or version == TESTED_VERSION:
        return TESTED_TASKS
    return tuple(sorted(datasets()))


def datasets() -> dict[str, Any]:
    """reasoning-gym's registry: task name -> (dataset class, config class)."""
    require_installed()
    # Heavy optional dependency (about 4 s to import): only when a task is built or scored.
    from reasoning_gym.factory import DATASETS

    return DATASETS


def require_installed() -> None:
    """Raise a :class:`ConfigError` saying how to install reasoning-gym when it is missing."""
    if installed_version() is None:
        raise ConfigError(
            f"reasoning-gym is not installed; the rg/<task> recipes and the rg loaders need it: "
            f"{INSTALL_HINT}"
        )


def check_task(name: object) -> str:
    """``name`` when it is a task of the installed reasoning-gym, else a clear error."""
    require_installed()
    known = task_names()
    if not isinstance(name, str) or name not in known:
        hint = did_you_mean(name, known) if isinstance(name, str) else ""
        raise ConfigError(
            f"unknown reasoning-gym task {name!r}.{hint} The installed reasoning-gym "
            f"({installed_version()}) has {len(known)} tasks; `areno train --list-recipes` "
            "lists them as rg/<task>."
        )
    return name


def config_fields(task: str) -> dict[str, Any]:
    """The options of ``task``'s config dataclass with their defaults, without ``seed`` and
    ``size`` (the pack sets those from the spec row)."""
    _, config_cls = datasets()[check_task(task)]
    out: dict[str, Any] = {}
    for field in dataclasses.fields(config_cls):
        if field.name in RESERVED_FIELDS:
            continue
        if field.default is not dataclasses.MISSING:
            out[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            out[field.name] = field.default_factory()
        else:
            out[field.name] = None
    return out
