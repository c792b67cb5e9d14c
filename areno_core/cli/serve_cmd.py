"""``areno serve``: parse, start the endpoint, print how to reach it, wait for Ctrl-C."""

from __future__ import annotations

import signal
import threading
from typing import Any

import click
from rich.console import Console

from areno_core.registry import get_registry

console = Console()

SERVE_HELP = """Serve a checkpoint on the OpenAI-compatible endpoint that agents use in training.

\b
Example:
  areno serve --ckpt runs/demo-arith/step_500 --port 8000 --api-key sk-local
  # openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="sk-local")

Same endpoint as agentic rollouts (/v1/chat/completions with tools, logprobs and streaming,
/v1/models), with the same checks and limits. --ckpt takes a model directory, a run's
--save-path (its latest checkpoint), a Hugging Face id or random:... It listens on 127.0.0.1.
Without --api-key a random key is made and printed. Ctrl-C stops it.
"""


@click.command("serve", help=SERVE_HELP)
@click.option("--ckpt", required=True, help="Checkpoint to serve.")
@click.option("--port", type=int, default=8000, show_default=True, help="0: any free port.")
@click.option("--api-key", default=None, help="Bearer key clients must send (default: random).")
@click.option("--model-name", default="policy", show_default=True, help="Name in /v1/models.")
@click.option("--max-new-tokens", type=int, default=512, show_default=True, help="Most tokens.")
@click.option("--max-prompt-tokens", type=int, default=4096, show_default=True)
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--disable-thinking", is_flag=True, help="Chat template flag (Qwen3).")
@click.option("--rollout-engine", "engine", default="native", show_default=True)
@click.option("--max-running-prompts", type=int, default=None, help="Sequences decoded at once.")
@click.option("--timeout-s", type=float, default=300.0, show_default=True, help="Per request.")
@click.option(
    "--attn-backend",
    type=click.Choice(["flash", "native"]),
    default=None,
    help="Default: flash on a GPU, native elsewhere.",
)
@click.option("--device", default="auto", show_default=True)
@click.option("--dtype", default="auto", show_default=True)
@click.option("--seed", type=int, default=None, help="Seeds requests that give no seed.")
def serve(**options: Any) -> None:
    from areno_core.serve import ServeSettings, start_server, trim_records  # the model stack

    settings = ServeSettings(**options)
    server = start_server(settings, get_registry())
    console.print(
        f"[bold]areno serve[/] {settings.ckpt}\n"
        f"  base_url  {server.base_url}\n  api_key   {server.api_key}\n"
        f"  model     {server.model_name}\nCtrl-C stops it.",
        highlight=False,
    )
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            trim_records(server)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()
        server.engine.end_session(drop_state=True)
        console.print("areno serve stopped.", highlight=False)
