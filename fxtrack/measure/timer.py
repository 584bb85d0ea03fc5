"""The one step timer every framework's run goes through (docs/fairness.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from typing import Any, Callable, ContextManager, Optional

from fxtrack.measure.progress import progress


@dataclasses.dataclass
class StepTimes:
    first_step_time_s: float  # the run's first step, raw: tracing, compilation, autotuning, ...
    step_times_s: list[float]  # each timed step, each ended by the backend's explicit sync
    window_s: float  # wall time of the whole timed window
    loss_handles: list[Any]  # one per step (warm-up included), read only after the window


def time_steps(step: Callable[[], Any], warmup_steps: int, steps: int, show: bool = True,
               label: str = "", window: Optional[ContextManager] = None,
               min_steps: int = 0, min_duration_s: float = 0.0) -> StepTimes:
    """Run ``warmup_steps`` untimed steps, then ``steps`` timed ones, and more until at least
    ``min_steps`` are timed and the window has lasted ``min_duration_s`` (both); the very first
    step's time is kept apart as ``first_step_time_s`` (with ``warmup_steps=0`` it is also the
    first timed step, compilation included: the user asked for that).

    ``step`` runs one step on device-resident data and returns only once the device is done
    (torch.cuda.synchronize / block_until_ready / fetching the loss), handing back a loss handle
    that is converted to a number only after the timed window. ``window`` (e.g. the NVML
    sampler) is entered just before the first timed step and left just after the last.
    """
    if steps < 1 or warmup_steps < 0:
        raise ValueError(f"need steps >= 1 and warmup_steps >= 0, got {steps} and {warmup_steps}")
    handles: list[Any] = []
    first: Optional[float] = None
    bar = progress(total=warmup_steps + steps, desc=f"{label} warm-up", enabled=show)
    for _ in range(warmup_steps):
        t = time.perf_counter()
        handles.append(step())
        first = time.perf_counter() - t if first is None else first
        bar.update(1)
    bar.set_description(f"{label} timed")
    times: list[float] = []
    with window or contextlib.nullcontext():
        window_start = time.perf_counter()
        floor = max(steps, min_steps)
        while len(times) < floor or time.perf_counter() - window_start < min_duration_s:
            t = time.perf_counter()
            handles.append(step())
            times.append(time.perf_counter() - t)
            bar.update(1)
        window_s = time.perf_counter() - window_start
    bar.close()
    return StepTimes(times[0] if first is None else first, times, window_s, handles)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), without numpy."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def step_metrics(times: StepTimes, global_batch: int, compiled: bool) -> dict[str, float]:
    """Throughput and step-time statistics in the metric keys of docs/contract.md.

    ``compile_time_s`` = first step - median timed step (>= 0): what the first step cost beyond
    an ordinary step. Logged only when ``compiled`` (the worker compiled the step): an eager
    first step is slow too (allocator, cuDNN/oneDNN kernel choice), but that is not compilation,
    and ``first_step_time_s`` shows it raw.
    """
    ms = [t * 1e3 for t in times.step_times_s]
    mean = sum(ms) / len(ms)
    std = (sum((x - mean) ** 2 for x in ms) / len(ms)) ** 0.5
    out = {
        "throughput_samples_per_s": global_batch * len(ms) / times.window_s,
        "step_time_ms_p50": percentile(ms, 50),
        "step_time_ms_p90": percentile(ms, 90),
        "step_time_ms_p99": percentile(ms, 99),
        "step_time_ms_mean": mean,
        "step_time_ms_std": std,
        "step_time_cv": std / mean if mean else 0.0,
        "first_step_time_s": times.first_step_time_s,
    }
    if compiled:
        median_s = percentile(times.step_times_s, 50)
        out["compile_time_s"] = max(0.0, times.first_step_time_s - median_s)
    return out


def eprint(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)
