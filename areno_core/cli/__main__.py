"""``python -m areno_core.cli``: the ``areno`` command, for launchers such as torchrun::

torchrun --nproc-per-node 2 -m areno_core.cli train --world-size 2 ...
"""

from areno_core.cli.main import main

main()
