"""``fxtrack`` / ``python -m fxtrack``: the Hydra app, plus the sub-commands report, doctor, sync."""

from __future__ import annotations

import sys
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
SUBCOMMANDS = {
    "doctor": "installed frameworks, their versions, the devices each sees, the peak FLOP/s",
    "report": "comparison tables and charts from MLflow runs (stdout, Markdown, HTML, CSV, PNG)",
    "sync": "upload results that an unreachable tracking server missed",
}

_USAGE = """\
fxtrack: one model, measured the same way in PyTorch, TensorFlow and JAX, logged to MLflow.

usage:
  python -m fxtrack [group=option ...] [key=value ...]      one run
  python -m fxtrack -m framework=torch,jax model=vit,bert   a sweep (one MLflow parent run)
  fxtrack {subcommands}

config groups (group=option):
{groups}
keys: batch_size (per device; null = the hardware's default), devices, steps, warmup_steps,
  seed, timeout_s, verbose, framework.compile, framework.python, tracking.experiment,
  tracking.uri, model.<size> (e.g. model.layers=2 model.image_size=32)

sub-commands:
{commands}
Hydra's own options: --cfg job (show the composed config), --hydra-help, -m / --multirun.
"""


def usage() -> str:
    groups = "".join(f"  {d.name}: {', '.join(sorted(p.stem for p in d.glob('*.yaml')))}\n"
                     for d in sorted(CONF_DIR.iterdir()) if d.is_dir())
    commands = "".join(f"  fxtrack {name}: {text}\n" for name, text in SUBCOMMANDS.items())
    return _USAGE.format(subcommands="|".join(SUBCOMMANDS), groups=groups, commands=commands)


def main() -> None:
    from fxtrack.environment import secure_process

    # Credentials inside tracking URIs move to MLFLOW_TRACKING_USERNAME/PASSWORD before Hydra
    # or MLflow print, log or spool anything (issue 14).
    secure_process(sys.argv)
    try:
        _main()
    except KeyboardInterrupt:  # Ctrl-C outside a worker: one line and the shell's status
        print("fxtrack: interrupted", file=sys.stderr)
        sys.exit(130)


def _main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        command = sys.argv.pop(1)
        from fxtrack import commands

        sys.exit(getattr(commands, command)(sys.argv[1:]))
    if not (CONF_DIR / "config.yaml").is_file():
        sys.exit(f"fxtrack: no config directory at {CONF_DIR}; install fxtrack from its checkout "
                 "(pip install -e .)")
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(usage(), end="")
        return
    run_app()


def run_app() -> None:
    import hydra

    from fxtrack.config import register
    from fxtrack.orchestrator.app import task

    register()
    hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(task)()
