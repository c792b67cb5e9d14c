"""Play DuelGrid in the browser against a model served behind an OpenAI-compatible endpoint.

    python examples/agentic/duelgrid/web_ui.py \
        --base-url http://127.0.0.1:8000/v1 --api-key EMPTY --model policy

You play U, the model plays A; the page runs the same rule engine as training. The server
binds 127.0.0.1 on a free port (``--host`` / ``--port`` to change) and prints its address.
Other options: ``--timeout``, ``--seed``, ``--replay FILE`` (with ``--replay-index``) to
replay recorded games, ``--disable-thinking``.

The agentic pack's UI does the work (``python -m areno_recipes_agentic.duelgrid.web_ui`` is the
same command).
"""

from areno_recipes_agentic.duelgrid.web_ui import main

if __name__ == "__main__":
    raise SystemExit(main())
