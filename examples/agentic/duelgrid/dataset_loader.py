"""DuelGrid starting states as chat prompts for the DuelGrid agent.

    areno train ... --dataset-loader-fn examples/agentic/duelgrid/dataset_loader.py

Row contract
    in:  ``state`` (a DuelGrid state dict, as the generator writes it), optionally ``mode``
         (``"tool"``, the default, or ``"text"``) and ``turns`` (rounds to play, 1-16);
    out: the same row plus ``prompt`` (the rules and the rendered map, asking for A's
         actions) and, in tool mode, ``tools`` (the ``choose_action`` schema). A malformed
         state is an error.

The work is done by ``areno_recipes_agentic.duelgrid.loader.duelgrid_loader`` (the agentic
pack's ``duelgrid`` loader).
"""

from areno_recipes_agentic.duelgrid.loader import duelgrid_loader


def load_row(row):
    """The default function ``--dataset-loader-fn`` calls for each raw row."""
    return duelgrid_loader(row)
