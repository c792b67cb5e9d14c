"""Tic-tac-toe: a perfect minimax player, a position generator, a loader and a graded reward."""

from __future__ import annotations
