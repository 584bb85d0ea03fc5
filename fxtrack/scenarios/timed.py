"""What every timed scenario shares: defaults, build, the timed window, and its metrics."""

from __future__ import annotations

from typing import Any, Callable

from fxtrack import defaults, policy
from fxtrack.frameworks.base import Backend
from fxtrack.job import Result
from fxtrack.measure.memory import peak_rss_mib
from fxtrack.measure.nvml import NvmlWindow
from fxtrack.measure.timer import eprint, step_metrics, time_steps


def build(backend: Backend, result: Result) -> tuple[str, int, int, int]:
    """Pick the device, fill the defaults the config left open, build the model; returns
    (device kind, batch, steps, warm-up steps)."""
    spec = backend.spec
    kind = backend.device_kind()
    # framework.compile=auto resolved here, once the device is known and before the build.
    spec.compile, why = policy.resolve_compile(spec.framework, kind, spec.arch["family"],
                                               spec.compile_request)
    result.resolved["compile"] = spec.compile
    result.tags["compile_rule"] = why
    batch, steps, warmup = defaults.resolve(spec.arch["name"], kind, spec.batch_size, spec.steps,
                                            spec.warmup_steps)
    result.resolved.update(batch_size=batch, steps=steps, warmup_steps=warmup, device_kind=kind)
    eprint(f"[fxtrack] building {spec.arch['name']} in {spec.framework} on {kind} for "
           f"{spec.scenario} (batch {batch}, {spec.precision}, compile={spec.compile})")
    backend.build(batch)
    return kind, batch, steps, warmup


def run_timed(backend: Backend, result: Result, prepare: Callable[[], Callable[[], Any]],
              flops_per_sample: int) -> list[Any]:
    """Build the model, time ``prepare()``'s step, and fill ``result`` with the figures common to
    every scenario. Returns the step handles (warm-up included) for scenario-specific use."""
    spec = backend.spec
    kind, batch, steps, warmup = build(backend, result)
    step = prepare()
    nvml = NvmlWindow(enabled=kind == "gpu")
    times = time_steps(step, warmup, steps, show=spec.progress,
                       label=f"{spec.framework}-{spec.arch['name']}", window=nvml)

    global_batch = batch * spec.devices * spec.nodes  # every device of every node
    m = result.metrics
    m.update(step_metrics(times, global_batch))
    m.update(param_count=float(backend.param_count()),
             peak_rss_mib=backend.reduce_max(peak_rss_mib()),  # the largest process
             flops_per_sample=float(flops_per_sample))
    m["achieved_tflops"] = flops_per_sample * m["throughput_samples_per_s"] / 1e12
    m.update(nvml.metrics(global_batch * steps))
    peak = backend.peak_memory_bytes()
    if peak is not None:
        m["peak_mem_device_mib"] = backend.reduce_max(peak / 2**20)  # the fullest device
    result.series["step_time_ms"] = [t * 1e3 for t in times.step_times_s]
    return times.loss_handles
