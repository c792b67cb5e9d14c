"""DuelGrid agent: the policy plays A against a scripted U for a few rounds per sample.

    areno train ... --agent-fn examples/agentic/duelgrid/run_agent.py

Each round it asks the endpoint at ``ctx.get_base_url()`` for A's actions (with the
``choose_action`` tool), plays them and U's scripted reply with the rule engine, and sends the
results back as tool and user messages. It plays ``row["turns"]`` rounds (default 2) or until
the game ends, and returns one ``AgentTrajectory`` per sample; the tool and user messages are
observations, masked from the loss.

The work is done by ``areno_recipes_agentic.duelgrid.agent.run_agent`` (the agentic pack's
``duelgrid`` agent).
"""

from areno_recipes_agentic.duelgrid.agent import run_agent as _pack_run_agent


async def run_agent(ctx, batch):
    """The default function ``--agent-fn`` calls once per step with all of its samples."""
    return await _pack_run_agent(ctx, batch)
