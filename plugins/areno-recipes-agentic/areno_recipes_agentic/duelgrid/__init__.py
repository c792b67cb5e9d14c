"""DuelGrid: a deterministic grid duel, a state generator, a loader and an outcome reward."""

from __future__ import annotations
