"""``fxtrack`` / ``python -m fxtrack``: the Hydra app, plus the sub-commands report, doctor, sync."""

from __future__ import annotations

import sys
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
SUBCOMMANDS = ("sync",)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        command = sys.argv.pop(1)
        from fxtrack import commands

        sys.exit(getattr(commands, command)(sys.argv[1:]))
    run_app()


def run_app() -> None:
    import hydra

    from fxtrack.config import register
    from fxtrack.orchestrator.app import task

    if not (CONF_DIR / "config.yaml").is_file():
        sys.exit(f"fxtrack: no config directory at {CONF_DIR}; install fxtrack from its checkout "
                 "(pip install -e .)")
    register()
    hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(task)()
