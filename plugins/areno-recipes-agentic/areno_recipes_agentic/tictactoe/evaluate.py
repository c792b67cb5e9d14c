"""How well a checkpoint plays tic-tac-toe through tool calls: move quality and win rate.

    python -m areno_recipes_agentic.tictactoe.evaluate --ckpt runs/ttt-cpu
    python -m areno_recipes_agentic.tictactoe.evaluate --ckpt runs/ttt-cpu --all-steps \\
        --curve-out runs/ttt-cpu/eval.json

Two measurements, both with greedy decoding (deterministic for a checkpoint):

* **positions**: the model's move on each held-out position (default: the pack's
  ``tictactoe_cpu_eval.jsonl``), prompted exactly as in training (with rows that force the
  call, the reply starts with it, as the endpoint does for ``tool_choice``) and read from its
  ``choose_square`` call the way the endpoint and the reward read it. Reported: ``reward``
  (the mean training reward), ``optimal`` (share of optimal moves), ``legal`` (share of legal
  moves) and ``tool_call`` (share of replies with a readable ``choose_square`` call).
* **games**: ``--games`` whole games (default 200) against an opponent that plays a uniformly
  random free square, half with the model as X (moving first) and half as O. Every model move
  is a fresh prompt of the current board; a reply without a legal move forfeits the game.
  Reported: ``win_rate``, ``draw_rate``, ``loss_rate`` (forfeits included) and ``forfeit_rate``.
  The opponent's moves come from a seeded RNG, so the games are the same for every checkpoint
  until the model's moves differ.

For reference, a player that picks a uniformly random free square wins about 44% of such
games (58% as X, 29% as O, by the known random-vs-random statistics).

A run's ``--save-path`` stands for its newest checkpoint; with ``--all-steps`` its starting
checkpoint (step 0, from its ``config.yaml``) and every ``step_N`` are evaluated.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from areno_recipes_agentic.tictactoe.game import is_terminal, legal_moves, play, to_move, winner
from areno_recipes_agentic.tictactoe.loader import tictactoe_loader
from areno_recipes_agentic.tictactoe.reward import score_move
from areno_recipes_agentic.tictactoe.tools import TOOL_NAME, choose_square_tool

EVAL_DATA = "resource:areno_recipes_agentic/data/tictactoe_cpu_eval.jsonl"
MAX_NEW_TOKENS = 64


@attrs.frozen
class PositionScores:
    reward: float
    optimal: float
    legal: float
    tool_call: float
    count: int


@attrs.frozen
class GameScores:
    win_rate: float
    draw_rate: float
    loss_rate: float
    forfeit_rate: float
    games: int


class MovePicker:
    """Greedy moves of a model for many boards at once, through the chat template and the
    same tool-call parser as the agentic endpoint."""

    def __init__(
        self, model: Any, tokenizer: Any, *, style: str = "compact", forced: bool = False
    ) -> None:
        from areno_core.rollout import EngineOptions, NativeEngine

        self.tokenizer = tokenizer
        self.style = style
        self.forced = forced
        self.engine = NativeEngine(
            model, tokenizer, EngineOptions(attn_backend="native", max_prompt_tokens=4096)
        )

    def moves(self, boards: Sequence[str]) -> list[int | None]:
        """The square the model picks on each board (None: no readable ``choose_square``)."""
        from areno_core.agentic.server import forced_tool_prefix
        from areno_core.agentic.toolparse import parse_assistant_text
        from areno_core.models.chat import encode_prompt
        from areno_core.types import SamplingParams

        if not boards:
            return []
        tools = [choose_square_tool(compact=self.style == "compact")]
        prefill = forced_tool_prefix(self.tokenizer, tools, TOOL_NAME) if self.forced else None
        prompts = []
        for board in boards:
            row = tictactoe_loader({"board": board, "style": self.style})
            ids = encode_prompt(self.tokenizer, row["prompt"], tools=tools)
            if prefill:
                ids += self.tokenizer.encode(prefill, add_special_tokens=False)
            prompts.append(ids)
        sampling = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, greedy=True, seed=0)
        self.engine.start_session()
        try:
            outputs = self.engine.generate(prompts, sampling, n=1)
        finally:
            self.engine.end_session()
        out: list[int | None] = []
        for completions in outputs:
            if not completions:
                out.append(None)
                continue
            ids = list(completions[0].token_ids)
            if completions[0].finish_reason == "stop" and ids:
                ids = ids[:-1]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            _, calls = parse_assistant_text((prefill or "") + text, tools=tools, parse_tools=True)
            out.append(_square(calls))
        return out


def _square(calls: Sequence[dict[str, Any]]) -> int | None:
    for call in calls:
        function = call.get("function") or {}
        if function.get("name") != TOOL_NAME:
            continue
        try:
            value = json.loads(function.get("arguments") or "{}").get("square")
        except (ValueError, AttributeError):
            return None
        if isinstance(value, bool):
            return None
        if isinstance(value, int | float) and float(value).is_integer():
            return int(value)
        if isinstance(value, str) and value.strip().isdigit():
            return int(value.strip())
        return None
    return None


def score_positions(picker: MovePicker, boards: Sequence[str]) -> PositionScores:
    squares = picker.moves(boards)
    rewards = [score_move(b, s) for b, s in zip(boards, squares, strict=True)]
    optimal = [r == 1.0 for r in rewards]
    legal = [s is not None and s in legal_moves(b) for b, s in zip(boards, squares, strict=True)]
    count = len(boards)
    return PositionScores(
        reward=sum(rewards) / count,
        optimal=sum(optimal) / count,
        legal=sum(legal) / count,
        tool_call=sum(s is not None for s in squares) / count,
        count=count,
    )


def play_games(picker: MovePicker, games: int, *, seed: int = 0) -> GameScores:
    """``games`` games against a random opponent, the model X in the even ones; all games
    advance together, one batched model call per round."""
    rng = random.Random(seed)
    boards = ["." * 9 for _ in range(games)]
    model_mark = ["X" if g % 2 == 0 else "O" for g in range(games)]
    result: list[str | None] = [None] * games  # "win", "draw", "loss", "forfeit"
    while any(r is None for r in result):
        waiting = [g for g in range(games) if result[g] is None]
        mine = [g for g in waiting if to_move(boards[g]) == model_mark[g]]
        for g, square in zip(mine, picker.moves([boards[g] for g in mine]), strict=True):
            if square is None or square not in legal_moves(boards[g]):
                result[g] = "forfeit"
            else:
                boards[g] = play(boards[g], square)
        for g in waiting:
            board = boards[g]
            if result[g] is None and not is_terminal(board) and to_move(board) != model_mark[g]:
                boards[g] = play(board, rng.choice(legal_moves(board)))
            if result[g] is None and is_terminal(boards[g]):
                won = winner(boards[g])
                result[g] = "draw" if won is None else "win" if won == model_mark[g] else "loss"
    counts = {k: sum(r == k for r in result) for k in ("win", "draw", "loss", "forfeit")}
    return GameScores(
        win_rate=counts["win"] / games,
        draw_rate=counts["draw"] / games,
        loss_rate=(counts["loss"] + counts["forfeit"]) / games,
        forfeit_rate=counts["forfeit"] / games,
        games=games,
    )


def evaluate_checkpoint(
    ckpt: str, *, dataset: str = EVAL_DATA, games: int = 200, limit: int | None = None
) -> dict[str, float]:
    """Both measurements for one checkpoint, as a flat dict."""
    import torch

    from areno_core.data import load_rows
    from areno_core.models.loading import load_model_and_tokenizer
    from areno_core.recipe import resolve_resource

    rows = load_rows(str(resolve_resource(dataset)))[:limit]
    boards = [str(r["board"]) for r in rows]
    style = str(rows[0].get("style") or "full") if rows else "compact"
    forced = bool(rows) and rows[0].get("tool_choice") == TOOL_NAME
    model, tokenizer = load_model_and_tokenizer(str(resolve_resource(ckpt)))
    model.eval()
    picker = MovePicker(model, tokenizer, style=style, forced=forced)
    with torch.inference_mode():
        positions = score_positions(picker, boards)
        played = play_games(picker, games) if games else None
    out = {f"positions/{k}": float(v) for k, v in attrs.asdict(positions).items()}
    if played is not None:
        out.update({f"games/{k}": float(v) for k, v in attrs.asdict(played).items()})
    return out


def resolve_checkpoint(path: str) -> str:
    """A checkpoint directory; a run's save root (with a ``latest`` file) means its newest."""
    from areno_core.recipe import resolve_resource

    root = Path(str(resolve_resource(path)))
    latest = root / "latest"
    return str(root / latest.read_text().strip()) if latest.is_file() else str(root)


def run_checkpoints(run: str | Path) -> list[tuple[int, str]]:
    """``(step, checkpoint)`` of a run: its starting checkpoint (step 0) and every step_N."""
    import yaml

    run = Path(run)
    out: list[tuple[int, str]] = []
    config = run / "config.yaml"
    if config.is_file():
        start = (yaml.safe_load(config.read_text()) or {}).get("basic", {}).get("ckpt")
        if isinstance(start, str) and not start.startswith("random:"):
            out.append((0, start))
    steps = sorted(
        (int(p.name.split("_", 1)[1]), str(p))
        for p in run.glob("step_*")
        if p.name.split("_", 1)[1].isdigit()
    )
    return out + steps


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m areno_recipes_agentic.tictactoe.evaluate",
        description="Greedy move quality on held-out positions and win rate against a random "
        "opponent for a tic-tac-toe checkpoint.",
    )
    parser.add_argument("--ckpt", required=True, help="checkpoint, or a run's --save-path")
    parser.add_argument("--dataset", default=EVAL_DATA, help="held-out positions (JSONL)")
    parser.add_argument("--games", type=int, default=200, help="games against a random player")
    parser.add_argument("--limit", type=int, default=None, help="evaluate the first N positions")
    parser.add_argument("--all-steps", action="store_true", help="every checkpoint of a run")
    parser.add_argument("--curve-out", default=None, help="write the points as JSON here")
    args = parser.parse_args(argv)
    if args.games < 0:
        parser.error("--games must be >= 0")
    if args.all_steps:
        points = run_checkpoints(args.ckpt)
        if not points:
            parser.error(f"{args.ckpt} holds no step_N checkpoint")
    else:
        points = [(-1, resolve_checkpoint(args.ckpt))]
    curve = []
    for step, ckpt in points:
        scores = evaluate_checkpoint(ckpt, dataset=args.dataset, games=args.games, limit=args.limit)
        curve.append({"step": step, "checkpoint": ckpt, **scores})
        shown = " ".join(f"{k}={v:.3f}" for k, v in scores.items() if not k.endswith("count"))
        prefix = f"step {step}: " if step >= 0 else ""
        print(f"{prefix}{shown}", flush=True)
    if args.curve_out:
        Path(args.curve_out).write_text(json.dumps(curve, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
