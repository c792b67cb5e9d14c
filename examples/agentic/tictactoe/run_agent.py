"""Tic-tac-toe agent: asks the policy for one move per sample through the run's endpoint.

    areno train ... --agent-fn examples/agentic/tictactoe/run_agent.py

For each sample it sends the row's prompt, with the ``choose_square`` tool in tool mode, to the
OpenAI-compatible endpoint at ``ctx.get_base_url()`` (model ``ctx.model``, key ``ctx.api_key``)
and returns the ``AgentTrajectoryTurn``. A row with ``"retries": N`` gets up to N more
attempts after an unplayable move (the error goes back as a tool message), and the sample is
then an ``AgentTrajectory`` of all attempts.

The work is done by ``areno_recipes_agentic.tictactoe.agent.run_agent`` (the agentic pack's
``tictactoe`` agent); ``play_sample`` there is the per-sample logic to start from when you
write your own.
"""

from areno_recipes_agentic.tictactoe.agent import run_agent as _pack_run_agent


async def run_agent(ctx, batch):
    """The default function ``--agent-fn`` calls once per step with all of its samples."""
    return await _pack_run_agent(ctx, batch)
