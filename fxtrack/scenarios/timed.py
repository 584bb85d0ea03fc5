"""What every timed scenario shares: defaults, build, the timed window, its metrics (an LM's
tokens/s, a user's model's FLOPs) and the correctness guard on its losses."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from typing import Any, Callable, ContextManager, Iterator, Optional, Union

from fxtrack import architectures, families
from fxtrack.frameworks.base import Backend
from fxtrack.frameworks.declaration import declaration
from fxtrack.worker import protocol
from fxtrack.worker.protocol import Result
from fxtrack.measure import host_load as load
from fxtrack.measure import peak
from fxtrack.measure import tuned as tuned_cache
from fxtrack.measure.memory import peak_rss_mib
from fxtrack.measure.nvml import NvmlWindow
from fxtrack.measure.nvml import check_before as nvml_check_before
from fxtrack.measure.system import SystemSampler
from fxtrack.measure.timer import StepTimes, eprint, step_metrics, time_steps
from fxtrack.scenarios import tune


def writes(spec: Any) -> bool:
    """Whether this process writes what the run keeps (under torchrun rank 0 of node 0 speaks
    for every rank; every other process of a run computes the same and writes nothing)."""
    return int(os.environ.get("RANK", "0")) == 0 and spec.node_rank == 0


def build(backend: Backend, result: Result) -> tuple[str, int, int, int]:
    """Pick the device, fill the defaults the config left open, build the model; returns
    (device kind, batch, steps, warm-up steps)."""
    spec = backend.spec
    kind = backend.device_kind()
    batch, steps, warmup = architectures.run_defaults(spec.arch["name"], kind, spec.batch_size,
                                                      spec.steps, spec.warmup_steps)
    result.resolved.update(batch_size=batch, steps=steps, warmup_steps=warmup, device_kind=kind)
    if kind == "gpu":  # other processes on its GPUs, before any work (hardware.gpu_isolation)
        result.tags.update(nvml_check_before(
            gpu_ordinals(spec)[0], spec.gpu_isolation, spec.wait_for_idle_s, eprint))
    # framework.compile resolved here, once the device is known and before the build: auto by
    # the framework's table, tune by timing its modes on this model (then built afresh below)
    # auto: an earlier tune's pick for this very configuration on this machine, else the table
    tuned = spec.compile_request == "tune"
    key = tuned_key(backend, kind, batch)
    earlier = tuned_cache.lookup(key) if spec.compile_request == "auto" else None
    if tuned:
        spec.compile, why, figures = tune.fastest(backend, kind, batch, steps, warmup)
        result.tags["compile_tuned"] = figures
        if writes(spec):
            tuned_cache.record(key, spec.compile, figures)
    elif earlier is not None:
        spec.compile = earlier["compiled"]
        why = f"auto: tuned on this machine {earlier.get('date', '')} ({earlier.get('figures')})"
    else:
        spec.compile, why = declaration(spec.package).resolve_compile(
            kind, spec.arch["family"], spec.compile_request, dims=spec.arch["dims"],
            precision=spec.precision)
    result.resolved["compile"] = spec.compile
    result.tags["compile_rule"] = why
    result.tags["compile_decision"] = ("tuned" if tuned or earlier is not None else
                                       "table" if spec.compile_request == "auto" else "asked")
    eprint(f"[fxtrack] building {spec.arch['name']} in {spec.framework} on {kind} for "
           f"{spec.scenario} (batch {batch}, {spec.precision}, compile={spec.compile})")
    with tune.requested(spec, spec.compile) if tuned else contextlib.nullcontext():
        backend.build(batch)
    protocol.pass_gate()  # built, nothing timed yet: the orchestrator's own work goes first
    return kind, batch, steps, warmup


def tuned_key(backend: Backend, kind: str, batch: int) -> str:
    """The compile-mode cache key of this run (fxtrack.measure.tuned)."""
    spec = backend.spec
    device = backend.device_tags().get("device", kind)  # as calibration names the device
    return tuned_cache.cache_key(device, peak.thread_count(spec.cpu_threads), spec.framework,
                                 spec.arch["family"], spec.arch["dims"], spec.precision, batch,
                                 spec.framework_settings)


def run_timed(backend: Backend, result: Result, prepare: Callable[[], Callable[[], Any]],
              flops_per_sample: Union[int, Callable[[], Optional[float]]],
              min_steps: int = 0, min_duration_s: float = 0.0) -> list[Any]:
    """Build the model, time ``prepare()``'s step, and fill ``result`` with the figures common to
    every scenario (start, time_steps, finish). Returns the step handles (warm-up included).
    ``min_steps`` and ``min_duration_s``: the window runs on past ``steps`` until both are met
    (time_steps)."""
    timing = start(backend, result, prepare)
    times = time_steps(timing.step, timing.warmup, timing.steps,
                       **timing.options(min_steps, min_duration_s))
    return finish(timing, result, times, flops_per_sample)


@dataclasses.dataclass
class Timing:
    """A timed window about to be taken (``start``): the built model's device kind, batch and
    step counts, the step to time, and the window's samplers."""

    backend: Backend
    kind: str
    batch: int
    steps: int
    warmup: int
    step: Callable[[], Any]
    window: "Window"

    def options(self, min_steps: int = 0, min_duration_s: float = 0.0) -> dict[str, Any]:
        """time_steps' keywords for this window."""
        spec = self.backend.spec
        return dict(show=spec.progress, label=f"{spec.framework}-{spec.arch['name']}",
                    window=self.window.sampling(), min_steps=min_steps,
                    min_duration_s=min_duration_s)


def start(backend: Backend, result: Result,
          prepare: Callable[[], Callable[[], Any]]) -> Timing:
    """Build the model, take ``prepare()``'s step, open the window's samplers (after the probe
    of other processes' load): what time_steps needs."""
    kind, batch, steps, warmup = build(backend, result)
    step = prepare()
    return Timing(backend, kind, batch, steps, warmup, step, open_window(backend.spec, kind))


def finish(timing: Timing, result: Result, times: StepTimes,
           flops_per_sample: Union[int, Callable[[], Optional[float]]]) -> list[Any]:
    """Fill ``result`` with the figures common to every scenario from the window ``times``
    took; returns the step handles (warm-up included) for scenario-specific use.
    ``flops_per_sample``: a number, or a function counting them on the built model (a user's
    model: its framework's counter), called after the timed window."""
    backend, spec = timing.backend, timing.backend.spec
    if callable(flops_per_sample):
        flops_per_sample = flops_per_sample()

    global_batch = timing.batch * spec.devices * spec.nodes  # every device of every node
    m = result.metrics
    m.update(step_metrics(times, global_batch, compiled=compiles(spec)))
    m.update(param_count=float(backend.param_count()),
             peak_rss_mib=backend.reduce_max(peak_rss_mib()))  # the largest process
    if flops_per_sample is not None:  # None: the counter could not (fxtrack.flops_unavailable)
        m["flops_per_sample"] = float(flops_per_sample)
        m["achieved_tflops"] = flops_per_sample * m["throughput_samples_per_s"] / 1e12
    # the steps timed, not asked for: min_steps / min_duration_s may have run more
    record_window(backend, result, timing.window, timing.kind,
                  global_batch * len(times.step_times_s))
    result.series["step_time_ms"] = [t * 1e3 for t in times.step_times_s]
    return times.loss_handles


@dataclasses.dataclass
class Window:
    """What samples a measured window, as every scenario takes it: the NVML window (a GPU's
    memory, energy, conditions), the host-load probe before and sampler during (the contention
    check), and the system metrics (CPU, memory, GPU) read through it."""

    nvml: NvmlWindow
    before: Optional[load.LoadSampler]
    during: load.LoadSampler
    system: SystemSampler

    def sampling(self) -> ContextManager[None]:
        """The context every timed step (or served request) runs inside."""
        return load.sampling(self.during, _entered(self.nvml, self.system))


def open_window(spec: Any, kind: str, wait_for_quiet: bool = True) -> Window:
    """A window's samplers, after a probe of other processes' CPU use (waiting up to
    wait_for_idle_s for quiet; fxtrack/measure/host_load.py; ``wait_for_quiet=False``: none,
    the caller samples the load itself)."""
    memory_gpus, energy_gpus = gpu_ordinals(spec)
    before = (load.wait_for_idle(spec.wait_for_idle_s, spec.cpu_threads, eprint)
              if wait_for_quiet else None)
    return Window(NvmlWindow(memory_gpus, energy_gpus, enabled=kind == "gpu"), before,
                  load.LoadSampler(spec.cpu_threads),
                  SystemSampler(energy_gpus if kind == "gpu" else ()))  # the node's devices, once


def record_window(backend: Backend, result: Result, window: Window, kind: str,
                  samples: int) -> None:
    """The figures of a finished window into ``result``: the host load and the contended tag,
    on a GPU its NVML figures (energy over ``samples``) and conditions, the framework's peak
    device memory, and the system/... series with the times they were read at."""
    m = result.metrics
    figures, contended = load.window_figures(window.before, window.during)
    m.update(figures)
    if kind == "gpu":  # collectives: every process of the run takes this branch or none does
        m.update(nvml_metrics(backend, window.nvml, samples))
        result.tags.update(window.nvml.tags())
        # a GPU shared with another process measures the two together, as a shared core does
        contended = contended or any(k in result.tags for k in (
            "gpu_foreign_processes", "gpu_foreign_processes_before"))
    result.tags["contended"] = "true" if contended else "false"
    m.update(peak_memory_metrics(backend, result.tags))
    result.series.update(window.system.series)
    result.series_times_ms.update(window.system.times_ms)


def peak_memory_metrics(backend: Backend, tags: dict[str, str]) -> dict[str, float]:
    """The framework's own peak device memory on the fullest device of any process, each
    reading beside the tag naming what it counts (``peak_mem_device_kind``, e.g.
    torch.max_memory_allocated): allocators count different things, so a comparison across
    frameworks says which kind it compares. Empty where the framework has no counter (CPU)."""
    peak = backend.peak_memory()
    if peak is None:
        return {}
    m = {"peak_mem_device_mib": backend.reduce_max(peak.bytes / 2**20)}
    tags["peak_mem_device_kind"] = peak.kind
    if peak.reserved_bytes is not None:  # the allocator's pool, its cache included
        m["peak_mem_device_reserved_mib"] = backend.reduce_max(peak.reserved_bytes / 2**20)
        tags["peak_mem_device_reserved_kind"] = str(peak.reserved_kind)
    return m


def timed_window(spec: Any, kind: str, step: Callable[[], Any], warmup: int, steps: int,
                 wait_for_quiet: bool = True
                 ) -> tuple[StepTimes, NvmlWindow, Optional[load.LoadSampler], load.LoadSampler,
                            SystemSampler]:
    """The timed window itself, as every run takes it (and bench/overhead.py, which compares it
    step by step with a bare loop): warm-up, then ``steps`` timed steps inside the NVML window
    and the load sampler, after a probe of other processes' CPU use (waiting up to
    wait_for_idle_s for quiet; fxtrack/measure/host_load.py; ``wait_for_quiet=False``: none, the
    caller samples the load itself), with the system metrics sampled through it
    (measure/system.py). Returns (times, nvml, load before or None, load during, system)."""
    window = open_window(spec, kind, wait_for_quiet)
    times = time_steps(step, warmup, steps, show=spec.progress,
                       label=f"{spec.framework}-{spec.arch['name']}", window=window.sampling())
    return times, window.nvml, window.before, window.during, window.system


@contextlib.contextmanager
def _entered(*windows: Any) -> Iterator[None]:
    """``windows`` entered in order and left in reverse, as one context for sampling()."""
    with contextlib.ExitStack() as stack:
        for w in windows:
            stack.enter_context(w)
        yield


def compiles(spec: Any) -> bool:
    """Whether the first step built a graph (torch.compile, XLA, jax.jit, or a plain tf.function
    graph, which TensorFlow traces even with framework.compile=false), as the framework declares
    it: then ``compile_time_s`` is logged. ``spec.compile`` is resolved by build()."""
    return declaration(spec.package).builds_graph(spec.compile)


def gpu_ordinals(spec: Any) -> tuple[list[int], list[int]]:
    """(CUDA ordinals whose memory this process samples, those whose energy it reads).

    Every framework runs on the first ``spec.devices`` GPUs of each node: torch as one process
    per GPU (torchrun: LOCAL_RANK's), JAX and TensorFlow as one process driving them all. Memory
    is per process (NVML lists it by pid), so each process samples its own devices. Energy is
    per device, so each device is read once: by its node's first process, which reads all the
    node's devices; the other torchrun ranks read none."""
    node = list(range(spec.devices))
    if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        return [local_rank], node if local_rank == 0 else []
    return node, node


def node_sum(backend: Backend, value: Optional[float]) -> Optional[float]:
    """The sum over nodes of each node's first process's ``value`` (None: not measured there),
    on every process; None if any node has none. Backends offer one collective, ``reduce_max``:
    a sum is one max per node in which only that node's first process takes part (the others
    offer -1e300). ``nodes`` is small and this runs after the timed window. One node: the
    first process (rank 0, which writes the Result) already holds the sum."""
    spec = backend.spec
    if spec.nodes == 1:
        return value
    first = int(os.environ.get("LOCAL_RANK", "0")) == 0
    total = 0.0
    for node in range(spec.nodes):
        mine = (-1.0 if value is None else value) if first and spec.node_rank == node else -1e300
        got = backend.reduce_max(mine)
        if got < 0:
            return None
        total += got
    return total


def nvml_metrics(backend: Backend, nvml: NvmlWindow, samples: int) -> dict[str, float]:
    """NVML figures of the whole run: energy summed over every device of every node, memory of
    the fullest device. Called by every process of the run."""
    nvml.energy_j = node_sum(backend, nvml.energy_j)
    nvml.peak_bytes = int(backend.reduce_max(float(nvml.peak_bytes or 0))) or None  # 0: nowhere
    return nvml.metrics(samples)


def set_guard(backend: Backend, result: Result, losses: list[float]) -> None:
    """``result.guard`` from the losses (``guard``); for a user's model a loss that does not
    fall is a warning tag, not a failed guard."""
    result.guard = guard(backend, int(result.metrics["param_count"]), losses)
    if families.of(backend.arch).user is not None and result.guard.startswith("loss did not fall"):
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
    built = spec.user is not None
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
        builder = families.of(backend.arch).user.builder_capability
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
    expected = architectures.param_count(arch.name)
    if params != expected:
        return f"param_count {params:,} differs from the canonical {expected:,}"
    return "ok"
