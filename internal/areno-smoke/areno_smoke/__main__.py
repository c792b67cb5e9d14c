"""``python -m areno_smoke``: run the smoke matrix (see :mod:`areno_smoke.runner`)."""

from __future__ import annotations

import sys

from areno_smoke.runner import main

sys.exit(main())
