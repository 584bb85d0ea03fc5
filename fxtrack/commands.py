"""Sub-commands of the ``fxtrack`` console script other than the Hydra app."""

from __future__ import annotations


def doctor(argv: list[str]) -> int:
    from fxtrack.doctor import main

    return main(argv)


def report(argv: list[str]) -> int:
    from fxtrack.report.cli import main

    return main(argv)


def sync(argv: list[str]) -> int:
    """``fxtrack sync``: see fxtrack.tracking.sync."""
    from fxtrack.tracking.sync import main

    return main(argv)
