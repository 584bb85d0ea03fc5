"""The training scenario: time optimiser steps on device-resident synthetic data."""

from __future__ import annotations

import math

from fxtrack import architectures, defaults
from fxtrack.frameworks.base import Backend
from fxtrack.job import Result
from fxtrack.measure.memory import peak_rss_mib
from fxtrack.measure.timer import eprint, step_metrics, time_steps


def run(backend: Backend, result: Result) -> None:
    """Fill ``result`` with the training measurements of DESIGN.md section 4."""
    spec = backend.spec
    kind = backend.device_kind()
    batch, steps, warmup = defaults.resolve(spec.arch["name"], kind, spec.batch_size, spec.steps,
                                            spec.warmup_steps)
    result.resolved.update(batch_size=batch, steps=steps, warmup_steps=warmup, device_kind=kind)
    eprint(f"[fxtrack] building {spec.arch['name']} in {spec.framework} on {kind} "
           f"(batch {batch}, {spec.precision}, compile={spec.compile})")
    backend.build(batch)
    params = backend.param_count()
    times = time_steps(backend.train_step, warmup, steps, show=spec.progress,
                       label=f"{spec.framework}-{spec.arch['name']}")
    losses = [backend.loss_value(h) for h in times.loss_handles]

    m = result.metrics
    m.update(step_metrics(times, batch * spec.devices))
    m.update(param_count=float(params), loss_first=losses[0], loss_last=losses[-1],
             peak_rss_mib=peak_rss_mib())
    peak = backend.peak_memory_bytes()
    if peak is not None:
        m["peak_mem_device_mib"] = peak / 2**20
    result.series["step_time_ms"] = [t * 1e3 for t in times.step_times_s]
    result.series["loss"] = losses
    result.guard = guard(backend, params, losses)


def guard(backend: Backend, params: int, losses: list[float]) -> str:
    """The correctness guard: finite loss that falls, and the canonical parameter count."""
    arch = backend.arch
    if not all(math.isfinite(x) for x in losses):
        return "loss is not finite"
    if len(losses) > 1 and not losses[-1] < losses[0]:
        return f"loss did not fall ({losses[0]:.4g} -> {losses[-1]:.4g})"
    expected = architectures.PARAM_COUNTS[arch.name]
    if arch.canonical and params != expected:
        return f"param_count {params:,} differs from the canonical {expected:,}"
    return "ok"
