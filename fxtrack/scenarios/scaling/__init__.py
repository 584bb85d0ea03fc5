"""scenario=scaling: training throughput at 1, 2, 4, ... devices; each device count a run of
train's runner, swept by its driver."""

from __future__ import annotations

import dataclasses

from fxtrack.metrics import HIGHER, Metric
from fxtrack.scenarios.options import Options
from fxtrack.scenarios.registry import Scenario, register


@dataclasses.dataclass
class ScalingOptions(Options):
    """Throughput at 1, 2, 4, ... up to ``devices``: each device count a training run."""

    name: str = "scaling"


# the metrics only scenario=scaling logs (docs/contract.md's Metrics tables; fxtrack.metrics)
METRICS = (
    Metric("throughput_samples_per_s_x{N}", "samples/s", HIGHER, "throughput at N devices"),
    Metric("speedup_x{N}", "ratio", HIGHER, "throughput at N / at 1"),
    Metric("scaling_efficiency_x{N}", "fraction", HIGHER, "throughput at N / (N x at 1)"),
    Metric("scaling_efficiency", "fraction", HIGHER, "the efficiency at the largest N"),
)


SPEC = register(Scenario(
    "scaling", "training throughput at 1, 2, 4, ... devices and the scaling efficiency",
    ScalingOptions, __name__, own_metrics=METRICS, parts=("runner", "driver"), sweeps_devices=True))
