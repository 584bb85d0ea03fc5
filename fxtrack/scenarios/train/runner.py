"""The training scenario: time optimiser steps on device-resident synthetic data."""

from __future__ import annotations

import statistics

from fxtrack import families, flops
from fxtrack.frameworks.base import Backend
from fxtrack.frameworks.profiling import CATEGORIES
from fxtrack.worker.protocol import Result
from fxtrack.measure import host_load
from fxtrack.measure.timer import time_steps
from fxtrack.scenarios import timed
from fxtrack.scenarios.timed import lm_metrics, set_guard, user_flops


def run(backend: Backend, result: Result) -> None:
    """Fill ``result`` with the training measurements (docs/contract.md, scenario=train)."""
    counted = families.of(backend.arch).forward_flops is None  # its framework counts FLOPs
    # run_timed's three steps spelled out: the loop over the step is this scenario's own frame
    timing = timed.start(backend, result, lambda: backend.train_step)
    times = time_steps(timing.step, timing.warmup, timing.steps, **timing.options())
    handles = timed.finish(timing, result, times, user_flops(backend, result, "train")
                           if counted else flops.train_flops_per_sample(backend.arch))
    losses = [backend.loss_value(h) for h in handles]
    result.metrics.update(loss_first=losses[0], loss_last=losses[-1])
    result.metrics.update(lm_metrics(backend, result))
    state = backend.state_bytes_per_device()
    if state is not None:  # every process of the run takes this branch or none does
        result.metrics["state_mib_per_device"] = backend.reduce_max(state / 2**20)
    result.series["loss"] = losses
    set_guard(backend, result, losses)
    profile(backend, result)


def profile(backend: Backend, result: Result) -> None:
    """``scenario.profile_steps`` > 0: that many more steps under the framework's own profiler
    (its ``profile`` capability), after the timed window so its figures are untouched; the
    median profiled step's time in each category (``profile_<category>_ms``) and its wall span
    (``profile_step_ms``) against the same calls timed by fxtrack's timer
    (``profile_timed_step_ms``), the profiler in the ``profiler`` tag; the profiler's own cost
    against as many unprofiled steps timed just before and after
    (``profile_unprofiled_step_ms``), and whether
    other processes took the cores meanwhile (``profile_contended``)."""
    steps = getattr(backend.spec.options, "profile_steps", 0)  # scaling's children have none
    if not steps:
        return
    # The steps around share the profiled ones' load (the timed window's p50 may have seen
    # another); the sampler spans all three, as a burst during the profiled steps alone once
    # made them 2x the steps around them.
    # every core: the profiler's own threads run beside the step's (a JAX profiled step was
    # 1.16x the steps around it while another process held the core the step left free)
    with host_load.LoadSampler() as load:
        before = time_steps(backend.train_step, 0, steps, show=False).step_times_s
        done = backend.capability("profile").split_steps(backend, steps)
        after = time_steps(backend.train_step, 0, steps, show=False).step_times_s
    if load.other_cpu_frac is not None:
        result.tags["profile_contended"] = str(load.contended).lower()
    for category in CATEGORIES:
        result.metrics[f"profile_{category}_ms"] = done.seconds[category] * 1e3
    result.metrics["profile_step_ms"] = done.step_s * 1e3
    result.metrics["profile_timed_step_ms"] = done.timed_step_s * 1e3
    result.metrics["profile_unprofiled_step_ms"] = statistics.median(before + after) * 1e3
    result.tags["profiler"] = done.profiler
