"""scenario=scaling: training throughput at 1, 2, 4, ... devices; each device count a run of
train's runner, swept by its driver."""

from __future__ import annotations

import dataclasses

from fxtrack.scenarios.options import Options
from fxtrack.scenarios.registry import Scenario, register


@dataclasses.dataclass
class ScalingOptions(Options):
    """Throughput at 1, 2, 4, ... up to ``devices``: each device count a training run."""

    name: str = "scaling"


SPEC = register(Scenario(
    "scaling", "training throughput at 1, 2, 4, ... devices and the scaling efficiency",
    ScalingOptions, __name__, parts=("runner", "driver"), sweeps_devices=True))
