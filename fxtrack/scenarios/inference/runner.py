"""The inference scenario: forward passes in inference mode (BatchNorm running statistics, no
dropout, no autograd), timed like training; ``step_time_ms_*`` are per-batch latencies, also
logged as ``latency_ms_p50|p90|p99`` with the batches behind them. ``scenario.min_queries`` /
``scenario.min_duration_s`` run the window on until both are met; a p90 or p99 on fewer batches
than MLPerf's early-stopping rule needs is tagged undersized, as serve's p99 is. With
``runtime`` other than native, or ``quantize=dynamic_int8``, the model is served by a deployment
runtime (``scenarios.deploy``).
With ``model.from_run``, a converge run's trained weights are served and scored on its held-out
split (``scenarios.accuracy``)."""

from __future__ import annotations

from typing import Any

from fxtrack import families, flops
from fxtrack.frameworks.base import Backend
from fxtrack.frameworks.declaration import NotSupported
from fxtrack.worker.protocol import Result
from fxtrack.scenarios import accuracy, deploy
from fxtrack.scenarios.batching import min_queries_for, undersized
from fxtrack.scenarios.inference import InferenceOptions
from fxtrack.scenarios.options import from_json
from fxtrack.scenarios.timed import lm_metrics, param_guard, run_timed, user_flops


def run(backend: Backend, result: Result) -> None:
    trained = bool(backend.spec.from_run)  # model.from_run: a converge run's weights
    if trained:
        backend.capability("converge")  # before the build: NotSupported costs nothing
    options = from_json(InferenceOptions, backend.spec.options)  # typed, or the JobSpec's dict
    if options.min_duration_s and backend.spec.devices * backend.spec.nodes > 1:
        # each process would end its window on its own clock, one step apart: a DDP forward's
        # buffer broadcast would then wait forever; a count ends every process together
        raise NotSupported("scenario.min_duration_s with devices x hardware.nodes > 1 is not "
                           "supported: each process times its own window; use "
                           "scenario.min_queries")
    window = dict(min_steps=options.min_queries or 0,
                  min_duration_s=options.min_duration_s or 0.0)
    if deploy.is_deploy(backend.spec):
        deploy.run(backend, result, accuracy.evaluate if trained else None, **window)
    else:
        result.tags.update(runtime="native", quantize="none")
        own = families.of(backend.arch).user
        if own is not None:  # e.g. a user's model: its framework's own forward
            user = backend.capability(own.builder_capability)
            run_timed(backend, result, lambda: user.prepare_inference(backend),
                      user_flops(backend, result, "forward"), **window)
        else:
            inference = backend.capability("inference")

            def prepare() -> Any:
                if trained:
                    accuracy.load(backend)
                return inference.prepare(backend)

            run_timed(backend, result, prepare, flops.forward_flops_per_sample(backend.arch),
                      **window)
            if trained:
                accuracy.evaluate(backend, result)
    result.metrics.update(deploy.latency_metrics(result.metrics))
    tail_sizes(result)
    result.metrics.update(lm_metrics(backend, result))
    if result.guard == "ok":
        result.guard = param_guard(backend.arch, int(result.metrics["param_count"]))


def tail_sizes(result: Result) -> None:
    """The batches every latency percentile is taken over, and whether the p90 and the p99 rest
    on enough of them for MLPerf's early-stopping rule (the test serve's p99 is put to)."""
    have = len(result.series["step_time_ms"])
    result.metrics["latency_percentile_queries"] = float(have)

    def flag(q: int) -> str:
        return "true" if undersized(have, q) else "false"

    result.tags.update(latency_p90_min_queries=str(min_queries_for(90)),
                       latency_p90_undersized=flag(90),
                       latency_p99_min_queries=str(min_queries_for(99)),
                       latency_p99_undersized=flag(99))
