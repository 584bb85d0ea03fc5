"""``fxtrack sync``: deliver the spooled results that a tracking server missed."""

from __future__ import annotations


def sync(argv: list[str]) -> int:
    """``fxtrack sync``: see fxtrack.tracking.sync."""
    from fxtrack.tracking.sync import main

    return main(argv)
