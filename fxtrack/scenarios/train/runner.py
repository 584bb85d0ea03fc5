"""The training scenario: time optimiser steps on device-resident synthetic data."""

from __future__ import annotations

import math
import statistics
from typing import Callable, Optional

from fxtrack import architectures, families, flops
from fxtrack.frameworks.base import Backend
from fxtrack.frameworks.profiling import CATEGORIES
from fxtrack.job import Result
from fxtrack.measure import host_load
from fxtrack.measure.timer import time_steps
from fxtrack.scenarios.timed import run_timed


def run(backend: Backend, result: Result) -> None:
    """Fill ``result`` with the training measurements (docs/contract.md, scenario=train)."""
    counted = families.of(backend.arch).forward_flops is None  # its framework counts FLOPs
    handles = run_timed(backend, result, lambda: backend.train_step,
                        user_flops(backend, result, "train") if counted
                        else flops.train_flops_per_sample(backend.arch))
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


def set_guard(backend: Backend, result: Result, losses: list[float]) -> None:
    """``result.guard`` from the losses (``guard``); for a user's model a loss that does not
    fall is a warning tag, not a failed guard."""
    result.guard = guard(backend, int(result.metrics["param_count"]), losses)
    if families.of(backend.arch).flat_loss_warns and result.guard.startswith("loss did not fall"):
        # A user's data may be random (nothing to learn in a few steps): a warning tag, while
        # a loss that is not finite still fails the guard.
        result.tags["loss_not_falling"] = result.guard
        result.guard = "ok"


def lm_metrics(backend: Backend, result: Result) -> dict[str, float]:
    """A decoder LM's rate in what LM people read: ``tokens_per_s`` = sequences/s x seq_len
    (every position is a predicted token): model=llama's ``model.seq_len``, a user's LM
    (``model.kind=lm``) its inputs' length along ``model.seq_axis``, tagged ``model_kind`` and
    ``seq_len`` for the report's LM tables; nothing for other models."""
    arch, metrics, spec = backend.arch, result.metrics, families.of(backend.arch)
    if not spec.is_lm(arch):
        return {}
    # a user's LM: the length its inputs had, which only the built model knows
    built = spec.builder_capability is not None
    seq_len = backend.seq_len if built else arch.seq_len
    if seq_len is None or "throughput_samples_per_s" not in metrics:
        return {}
    if built:
        result.tags.update(model_kind="lm", seq_len=str(seq_len))
    return {"tokens_per_s": metrics["throughput_samples_per_s"] * seq_len}


def user_flops(backend: Backend, result: Result, step: str) -> Callable[[], Optional[float]]:
    """model=custom: the framework's own FLOP counter over one ``step`` (``train``: forward +
    backward; ``forward``), asked once the model is built and the timed window is over (the
    ``flops_source`` tag says which counter)."""
    def count() -> Optional[float]:
        builder = families.of(backend.arch).builder_capability
        counter = getattr(backend.capability(builder), f"{step}_flops_per_sample")
        try:
            value, result.tags["flops_source"] = counter(backend)
        except Exception as e:  # noqa: BLE001  (a construct the counter cannot see through)
            # The run's timed figures stand; only the FLOP count (and MFU) is missing, and why.
            result.tags["flops_unavailable"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"[:500]
            return None
        return value

    return count


# the guard's verdict on a run whose numbers are wrong, not only unusual: it fails the run's exit
# status (issue 43), where a loss that did not fall in a few steps is a warning
NOT_FINITE = "loss is not finite"


def guard(backend: Backend, params: int, losses: list[float]) -> str:
    """The correctness guard: finite loss that falls, and the canonical parameter count."""
    arch = backend.arch
    if not all(math.isfinite(x) for x in losses):
        return NOT_FINITE
    if len(losses) > 1 and not losses[-1] < losses[0]:
        return f"loss did not fall ({losses[0]:.4g} -> {losses[-1]:.4g})"
    return param_guard(arch, params)


def param_guard(arch: architectures.Arch, params: int) -> str:
    if not arch.canonical:  # resized, or a user's model: no table to compare with
        return "ok"
    expected = architectures.PARAM_COUNTS[arch.name]
    if params != expected:
        return f"param_count {params:,} differs from the canonical {expected:,}"
    return "ok"
