"""Command-line interface (``areno``)."""
