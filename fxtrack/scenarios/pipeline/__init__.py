"""scenario=pipeline: each framework's input pipeline from files on disk (its runner)."""

from __future__ import annotations

import dataclasses

from fxtrack.metrics import HIGHER, LOWER, NEITHER, Metric
from fxtrack.scenarios.options import Options, at_least, positive
from fxtrack.scenarios.registry import Scenario, register


@dataclasses.dataclass
class PipelineOptions(Options):
    name: str = "pipeline"
    dataset_samples: int = 512  # samples in the on-disk synthetic dataset ($FXTRACK_CACHE)
    loader_workers: int = 2  # loader processes / parallel calls

    def __post_init__(self) -> None:
        super().__post_init__()
        positive("scenario.", dataset_samples=self.dataset_samples)
        at_least("scenario.", 0, loader_workers=self.loader_workers)


# the metrics only scenario=pipeline logs (docs/contract.md's Metrics tables; fxtrack.metrics)
METRICS = (
    Metric("pipeline_samples_per_s", "samples/s", HIGHER, "the loader alone"),
    Metric("resident_samples_per_s", "samples/s", HIGHER, "training on device-resident data"),
    Metric("input_bound_fraction", "fraction, signed", LOWER, "the share of time lost to input"),
    Metric("resident_{" + "|".join(
        [f"step_time_ms_{s}" for s in ("p50", "p90", "p99", "mean", "std")]
        + ["step_time_cv", "first_step_time_s", "compile_time_s", "achieved_tflops",
           "energy_j_per_sample", "power_w_mean", "host_other_cpu_frac", "host_steal_frac",
           "host_loadavg_1m", "host_other_cpu_frac_before"]) + "}",
       "as the unprefixed key", NEITHER, "the resident window's figures"),
)


SPEC = register(Scenario(
    "pipeline", "each framework's input pipeline from files on disk, then training on it",
    PipelineOptions, __name__, own_metrics=METRICS, needs=("pipeline",), reads_files=True))
