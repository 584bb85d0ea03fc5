"""The input-pipeline scenario: each framework's idiomatic loader reading the on-disk synthetic
dataset (fxtrack.data.on_disk), measured alone and feeding training, against training on
device-resident data.

The standard keys describe ONE window, the loader-fed one: ``throughput_samples_per_s``, the
``step_time_ms_*`` percentiles, ``first_step_time_s``/``compile_time_s`` and the load figures.
The device-resident window's figures carry the ``resident_`` prefix (``resident_samples_per_s``,
``resident_step_time_ms_p50``, ...). The two windows alternate (resident, fed, resident, fed, ...:
ROUNDS rounds of ``steps`` each) so that drift in the machine hits both equally.
``pipeline_samples_per_s``: the loader alone. ``input_bound_fraction`` = 1 - fed / resident,
signed: 0.4 means training runs 40% slower because of input; a negative value means the fed
window ran faster, i.e. the difference is within the noise, and is logged as measured, not
clamped to 0.

model=custom: the loader reads the user's own batch, written in the framework's record format
(each pipeline module's ``user_dataset``; fxtrack.data.on_disk.ensure_user), with the same step
as scenario=train; FLOPs from the framework's counter, tokens/s for ``model.kind=lm``, and the
tags ``pipeline_records`` (the format) and ``pipeline_work`` (what is done per sample).
"""

from __future__ import annotations

import dataclasses
import time

from fxtrack import families, flops

from fxtrack.data import on_disk
from fxtrack.frameworks.base import Backend
from fxtrack.worker.protocol import Result
from fxtrack.measure import host_load as load
from fxtrack.measure.timer import StepTimes, step_metrics, time_steps
from fxtrack.scenarios.registry import options_of
from fxtrack.scenarios.timed import lm_metrics, run_timed, set_guard, user_flops

ROUNDS = 2  # alternations of the resident and the fed window
# model=custom: the user's arrays have nothing to decode or augment
USER_WORK = "read + deserialize + collate"
# Keys of the run_timed window that describe the resident window once the fed one owns the names.
_WINDOW_KEYS = ("throughput_samples_per_s", "step_time_ms_p50", "step_time_ms_p90",
                "step_time_ms_p99", "step_time_ms_mean", "step_time_ms_std", "step_time_cv",
                "first_step_time_s", "compile_time_s", "achieved_tflops", "energy_j_per_sample",
                "power_w_mean", "host_other_cpu_frac", "host_steal_frac", "host_loadavg_1m",
                "host_other_cpu_frac_before")


def _joined(windows: list[StepTimes]) -> StepTimes:
    """Several timed windows of one kind as one: the first one's first step, every timed step,
    the summed wall time."""
    return dataclasses.replace(windows[0], step_times_s=[t for w in windows for t in w.step_times_s],
                               window_s=sum(w.window_s for w in windows))


def run(backend: Backend, result: Result) -> None:
    spec = backend.spec
    pipeline = backend.capability("pipeline")  # before the build: NotSupported costs nothing
    options = options_of(spec)
    # Resident window 1: build, warm-up (the real compile), memory, load: run_timed's figures.
    user = families.of(backend.arch).user is not None  # its builder's data
    handles = run_timed(backend, result, lambda: backend.train_step,
                        user_flops(backend, result, "train") if user
                        else flops.train_flops_per_sample(backend.arch))
    m = result.metrics
    batch, steps, warmup = (result.resolved[k] for k in ("batch_size", "steps", "warmup_steps"))
    global_batch = batch * spec.devices * spec.nodes  # one draw is one step of every device
    resident = [StepTimes(m["first_step_time_s"], [t / 1e3 for t in result.series["step_time_ms"]],
                          global_batch * steps / m["throughput_samples_per_s"], [])]
    contended = result.tags.get("contended") == "true"
    for key in _WINDOW_KEYS:  # from here on, the standard names belong to the fed window
        if key in m:
            m[f"resident_{key}"] = m.pop(key)

    if user:  # at least two batches, so that every draw is a full one
        directory, result.tags["pipeline_records"] = pipeline.user_dataset(
            backend, max(options.dataset_samples, 2 * global_batch))
        result.tags["pipeline_work"] = USER_WORK
    else:
        directory = on_disk.ensure(backend.arch, options.dataset_samples, spec.seed)
    loader = pipeline.loader(backend, directory, batch, options.loader_workers)
    for _ in range(warmup):  # worker start-up, file-system cache, autotuning
        next(loader)
    t0 = time.perf_counter()
    for _ in range(steps):
        next(loader)
    m["pipeline_samples_per_s"] = global_batch * steps / (time.perf_counter() - t0)

    fed: list[StepTimes] = []
    sampler = load.LoadSampler(spec.cpu_threads).start()  # across the alternated windows
    for r in range(ROUNDS):
        if r:  # resident again; its one warm-up step is an ordinary (compiled) step
            resident.append(time_steps(backend.train_step, 1, steps, show=spec.progress,
                                       label=f"resident, round {r + 1}"))
        fed.append(time_steps(lambda: pipeline.train_step_on(backend, next(loader)), warmup, steps,
                              show=spec.progress, label=f"fed by the loader, round {r + 1}"))
    sampler.stop()

    compiled = bool(result.resolved.get("compile", spec.compile))
    res = step_metrics(_joined(resident), global_batch, compiled)
    m.update({f"resident_{k}": v for k, v in res.items()
              if k not in ("first_step_time_s", "compile_time_s")})  # run_timed's stay
    m["resident_samples_per_s"] = m.pop("resident_throughput_samples_per_s")
    fed_times = _joined(fed)
    m.update(step_metrics(fed_times, global_batch, compiled))  # the standard keys: the fed window
    m.update(sampler.metrics())
    result.tags["contended"] = "true" if contended or sampler.contended else "false"
    m["input_bound_fraction"] = 1.0 - m["throughput_samples_per_s"] / m["resident_samples_per_s"]
    if "flops_per_sample" in m:  # absent where a user's model's counter could not count it
        m["achieved_tflops"] = m["flops_per_sample"] * m["throughput_samples_per_s"] / 1e12
    m.update(lm_metrics(backend, result))  # tokens/s of the fed window
    result.series["step_time_ms"] = [t * 1e3 for t in fed_times.step_times_s]
    losses = [backend.loss_value(h) for h in handles]
    m.update(loss_first=losses[0], loss_last=losses[-1])
    set_guard(backend, result, losses)
