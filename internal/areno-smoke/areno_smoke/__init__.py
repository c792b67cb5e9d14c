"""areno-smoke: internal smoke recipes (one per algorithm) and the smoke matrix runner.

Never published. Run the matrix with ``python -m areno_smoke``; see ``runner.py``.
"""
