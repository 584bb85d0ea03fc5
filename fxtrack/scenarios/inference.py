"""The inference scenario: forward passes in inference mode (BatchNorm running statistics, no
dropout, no autograd), timed like training; ``step_time_ms_*`` are per-batch latencies, also
logged as ``latency_ms_p50|p90|p99``. With ``runtime`` other than native, or
``quantize=dynamic_int8``, the model is served by a deployment runtime (``scenarios.deploy``).
With ``model.from_run``, a converge run's trained weights are served and scored on its held-out
split (``scenarios.accuracy``)."""

from __future__ import annotations

from typing import Any

from fxtrack import families, flops
from fxtrack.frameworks.base import Backend
from fxtrack.job import Result
from fxtrack.scenarios import accuracy, deploy
from fxtrack.scenarios.timed import run_timed
from fxtrack.scenarios.train import lm_metrics, param_guard, user_flops


def run(backend: Backend, result: Result) -> None:
    trained = bool(backend.spec.from_run)  # model.from_run: a converge run's weights
    if trained:
        backend.capability("converge")  # before the build: NotSupported costs nothing
    if deploy.is_deploy(backend.spec):
        deploy.run(backend, result, accuracy.evaluate if trained else None)
    else:
        result.tags.update(runtime="native", quantize="none")
        builder = families.of(backend.arch).builder_capability
        if builder is not None:  # e.g. a user's model: its framework's own forward
            user = backend.capability(builder)
            run_timed(backend, result, lambda: user.prepare_inference(backend),
                      user_flops(backend, result, "forward"))
        else:
            inference = backend.capability("inference")

            def prepare() -> Any:
                if trained:
                    accuracy.load(backend)
                return inference.prepare(backend)

            run_timed(backend, result, prepare, flops.forward_flops_per_sample(backend.arch))
            if trained:
                accuracy.evaluate(backend, result)
    result.metrics.update(deploy.latency_metrics(result.metrics))
    result.metrics.update(lm_metrics(backend, result))
    if result.guard == "ok":
        result.guard = param_guard(backend.arch, int(result.metrics["param_count"]))
