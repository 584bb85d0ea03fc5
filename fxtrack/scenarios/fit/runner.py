"""Each probe of fit's search is a short training run: train's runner, declared here so that
every scenario's runner is found in its folder."""

from fxtrack.scenarios.train.runner import run

__all__ = ["run"]
