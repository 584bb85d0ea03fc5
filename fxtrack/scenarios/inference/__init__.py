"""scenario=inference: forward-only latency per batch, in the framework or a deployment
runtime (its runner)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from fxtrack.metrics import HIGHER, LOWER, NEITHER, Metric
from fxtrack.scenarios.options import Options, apart, positive
from fxtrack.scenarios.registry import MEASURE, Objective, Scenario, register


@dataclasses.dataclass
class InferenceOptions(Options):
    """The timed window runs ``steps`` batches, and on until it has timed at least
    ``min_queries`` batches and lasted ``min_duration_s`` (MLPerf's min_query_count and
    min_duration): a p99 needs 459 batches behind it (batching.min_queries_for)."""

    name: str = "inference"
    # None: steps alone
    min_queries: Optional[int] = apart("the window's length, as steps: a longer window sizes "
                                       "the tail, it measures the same thing", default=None)
    # None: no floor on the window's time
    min_duration_s: Optional[float] = apart("the window's length, as steps", default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        positive("scenario.", min_queries=self.min_queries, min_duration_s=self.min_duration_s)


# the metrics only scenario=inference logs (docs/contract.md's Metrics tables; fxtrack.metrics)
METRICS = (
    Metric("latency_ms_{p50|p90|p99}", "ms", LOWER, "one batch's forward time"),
    Metric("latency_percentile_queries", "count", NEITHER,
       "the timed batches every latency percentile is taken over"),
    Metric("output_max_abs_err", "logit units", LOWER, "largest difference from native fp32"),
    Metric("output_rel_err", "ratio", LOWER, "that difference / the largest native logit"),
    Metric("top1_agreement", "fraction", HIGHER, "share of samples whose top-1 matches native"),
    Metric("artefact_mib", "MiB", LOWER, "the exported file the runtime serves"),
    Metric("export_time_s", "s", LOWER, "export, quantisation and load of the served model"),
)


SPEC = register(Scenario(
    "inference", "forward-only latency per batch, in the framework or a deployment runtime",
    InferenceOptions, __name__, own_metrics=METRICS, trains=False, deploys=True, from_run=True,
    objectives=(
        Objective("latency", "Inference latency at batch 1", ("latency_ms_p50",), "one",
                  ("answers one sample of", "faster than"),
                  (MEASURE % "inference").replace(" repeats", " batch_size=1 repeats"), rank=20),
        Objective("inference", "Inference throughput at the largest batch",
                  ("throughput_samples_per_s",), "largest", ("infers", "as fast as"),
                  MEASURE % "inference", rank=30))))
