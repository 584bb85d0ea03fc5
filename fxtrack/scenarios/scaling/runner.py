"""Each device count of scaling's sweep is a training run: train's runner, declared here so
that every scenario's runner is found in its folder."""

from fxtrack.scenarios.train.runner import run

__all__ = ["run"]
