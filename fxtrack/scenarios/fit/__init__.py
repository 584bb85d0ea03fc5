"""scenario=fit: the largest batch (or sequence) that trains within a memory budget: its config
check (the budget), its driver (the probe search, each probe a run of train's runner) and its
report section."""

from __future__ import annotations

import dataclasses
from typing import Optional

from fxtrack.metrics import HIGHER, LOWER, NEITHER, Metric
from fxtrack.scenarios.options import Options, positive
from fxtrack.scenarios.registry import MEASURE, Objective, Scenario, register


@dataclasses.dataclass
class FitOptions(Options):
    """The largest batch_size (or, with axis=seq_len, the longest sequence of a language model)
    that trains within the memory budget: one parent run, one isolated worker per probe."""

    name: str = "fit"
    axis: str = "batch_size"  # or seq_len (language models)
    max_probes: int = 8
    max_batch: int = 4096  # the largest value probed on either axis
    # below 1: stop when the largest fit and the smallest miss are within this fraction of the
    # fit; 1 or more: a step
    resolution: float = 0.05
    memory_gib: Optional[float] = None  # None: the pre-check's memory; on a GPU its total

    def __post_init__(self) -> None:
        super().__post_init__()
        positive("scenario.", max_probes=self.max_probes, max_batch=self.max_batch,
                 resolution=self.resolution, memory_gib=self.memory_gib)
        if self.axis not in ("batch_size", "seq_len"):
            raise ValueError(f"scenario.axis must be batch_size or seq_len, got {self.axis!r}")


# the metrics only scenario=fit logs (docs/contract.md's Metrics tables; fxtrack.metrics)
METRICS = (
    Metric("max_batch_size", "samples", HIGHER, "the largest batch that fitted"),
    Metric("max_seq_len", "tokens", HIGHER, "the longest sequence that fitted"),
    Metric("throughput_at_max_samples_per_s", "samples/s", HIGHER, "throughput at the found value"),
    Metric("throughput_at_max_ci_{low|high}", "samples/s", HIGHER, "its 95% interval"),
    Metric("throughput_at_max_tokens_per_s", "tokens/s", HIGHER, "the same in tokens/s"),
    Metric("memory_per_sample_mib", "MiB", LOWER, "peak memory per sample (the line's slope)"),
    Metric("fixed_memory_mib", "MiB", LOWER, "peak memory at batch 0 (the line's intercept)"),
    Metric("memory_fit_r2", "fraction", NEITHER, "r^2 of that line"),
    Metric("memory_budget_gib", "GiB", NEITHER, "the budget each probe was held to"),
    Metric("fit_probes", "count", NEITHER, "probes the search ran"),
)


SPEC = register(Scenario(
    "fit", "the largest batch (or sequence) that trains within a memory budget",
    FitOptions, __name__, own_metrics=METRICS,
    parts=("runner", "driver", "check", "section"), memory_floor=False,
    probe_tag="fit_of",
    objectives=(
        Objective("fit", "Largest batch that fits",
                  ("max_batch_size", "throughput_at_max_samples_per_s"), "largest",
                  ("fits", "as large a batch of"), MEASURE % "fit", rank=10),)))
