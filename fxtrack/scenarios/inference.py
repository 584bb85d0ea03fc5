"""The inference scenario: forward passes in inference mode (BatchNorm running statistics, no
dropout, no autograd), timed like training; ``step_time_ms_*`` are per-batch latencies."""

from __future__ import annotations

from fxtrack import flops
from fxtrack.frameworks.base import Backend
from fxtrack.job import Result
from fxtrack.scenarios.timed import run_timed
from fxtrack.scenarios.train import param_guard


def run(backend: Backend, result: Result) -> None:
    run_timed(backend, result, backend.prepare_inference,
              flops.forward_flops_per_sample(backend.arch))
    result.guard = param_guard(backend.arch, int(result.metrics["param_count"]))
