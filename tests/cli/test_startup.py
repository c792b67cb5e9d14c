"""What a command loads before it has checked its options: not transformers' model stack.

A mistyped flag, ``--help`` or ``--dry-run`` must answer without the seconds of imports a run
needs, and ``--async-rollout`` starts its worker before the trainer's own heavy imports (see
areno_core.runner.boot). Each check runs in a fresh interpreter: this test process has loaded
everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Modules whose import costs seconds: transformers' model classes and areno's loaders of them.
HEAVY = ("transformers.modeling_utils", "areno_core.models.loading", "areno_core.rollout.native")

PROBE = """
import json, sys
from areno_core.cli.main import main
try:
    main({argv!r})
except SystemExit as exit:
    code = exit.code
else:
    code = 0
heavy = [name for name in {heavy!r} if name in sys.modules]
print(json.dumps({{"code": code, "heavy": heavy}}))
"""


def loaded_after(argv: list[str]) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "argv, code",
    [
        (["train", "--recipe", "math/arith", "--algo", "gspo", "--dry-run"], 0),
        (["train", "--recipe", "math/arith", "--algo", "gspo", "--lr", "fast"], 2),
        (["train", "--help"], 0),
    ],
    ids=["dry-run", "bad-value", "help"],
)
def test_checking_options_loads_no_model_stack(argv, code):
    seen = loaded_after(argv)
    assert seen["code"] == code
    assert seen["heavy"] == []


def test_the_lazy_packages_still_hand_out_every_name():
    import areno_core.models as models
    import areno_core.rollout as rollout

    for package in (models, rollout):
        for name in package.__all__:
            assert getattr(package, name) is not None
        with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
            package.nothing_here  # noqa: B018
