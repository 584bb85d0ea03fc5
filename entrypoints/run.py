"""MLproject entry point for runs and sweeps: ``python entrypoints/run.py KEY=VALUE ... -- "MORE"``.

Everything after ``--`` is one string of further Hydra overrides (``-P overrides="size=tiny
warmup_steps=1"``), split here the way a shell would. Under ``mlflow run`` fxtrack logs into the
run that ``mlflow run`` created (MLFLOW_RUN_ID, MLFLOW_EXPERIMENT_ID)."""

import shlex
import sys

from fxtrack.cli import main


def forward(*prefix: str) -> None:
    """Call the fxtrack CLI with ``prefix`` + this script's arguments, ``--`` strings split."""
    args = sys.argv[1:]
    if "--" in args:
        cut = args.index("--")
        args = args[:cut] + [a for extra in args[cut + 1:] for a in shlex.split(extra)]
    sys.argv = ["fxtrack", *prefix, *args]
    main()


if __name__ == "__main__":
    forward()
