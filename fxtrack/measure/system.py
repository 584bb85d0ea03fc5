"""System metrics through the timed window, under MLflow's own names (``system/...``, those of
``mlflow.system_metrics``), so that the MLflow UI's System metrics tab shows them.

A daemon thread sleeps ``period_s`` between samples and reads only psutil (``/proc``) and NVML:
nothing runs inside the step loop. One sample is taken as the window opens and one as it closes,
so even a window shorter than the period has two points. Each value carries its wall-clock time
(epoch ms), which the writer logs as the metric's timestamp; its index is the MLflow step.

Differences from MLflow's own monitor, on purpose:
- ``system/cpu_utilization_percentage`` is this worker's *process tree* (the worker, its threads,
  torchrun ranks, DataLoader workers), 100 = every CPU it may run on busy; the first sample's
  is its mean since the worker started, each later one the mean since the previous sample.
  Other processes' share is ``host_other_cpu_frac`` (measure/host_load.py).
- GPU figures are per device the run computes on, ``gpu_<i>`` being CUDA ordinal i.
Memory (``system_memory_usage_*``) is the machine's, as MLflow's.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional, Sequence

PERIOD_S = 0.5
MIN_SPAN_S = 0.2  # the shortest span a CPU value is measured over, where readings allow
CPU_KEY = "system/cpu_utilization_percentage"
MEMORY_MB_KEY = "system/system_memory_usage_megabytes"
MEMORY_PCT_KEY = "system/system_memory_usage_percentage"


def gpu_keys(ordinal: int) -> dict[str, str]:
    """MLflow's per-GPU key names for CUDA ordinal ``ordinal``."""
    return {"util": f"system/gpu_{ordinal}_utilization_percentage",
            "mem": f"system/gpu_{ordinal}_memory_usage_megabytes",
            "power": f"system/gpu_{ordinal}_power_usage_watts"}


def _tree_cpu_s(proc: Any) -> float:
    """CPU seconds of ``proc`` and its live descendants, reaped children included (their time
    moved into the parent's children_* fields when they exited)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except Exception:  # noqa: BLE001 - psutil.NoSuchProcess/AccessDenied: gone or not ours
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class SystemSampler:
    """Context manager over the timed window; after it, ``series`` (key -> values) and
    ``times_ms`` (key -> epoch ms per value). ``gpu_ordinals``: CUDA devices to read through NVML
    (none on CPU). A reading that fails (no psutil, no NVML, not permitted) leaves its series out:
    a figure that cannot be measured is never 0."""

    def __init__(self, gpu_ordinals: Sequence[int] = (), period_s: float = PERIOD_S) -> None:
        self.period_s = period_s
        self.series: dict[str, list[float]] = {}
        self.times_ms: dict[str, list[int]] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        try:
            import psutil

            self._psutil = psutil
            self._proc = psutil.Process()
            self._ncpu = len(self._proc.cpu_affinity()) if hasattr(self._proc, "cpu_affinity") \
                else psutil.cpu_count()
            self._readings = [(self._proc.create_time(), 0.0)]  # the first value: since start
        except Exception:  # noqa: BLE001 - no psutil or no /proc: no CPU and memory figures
            self._psutil = None
        self._gpus: list[tuple[int, Any]] = []
        if gpu_ordinals:
            try:
                import pynvml

                from fxtrack.measure.nvml import handles

                pynvml.nvmlInit()
                self._nvml = pynvml
                mapped = handles(pynvml, list(gpu_ordinals))
                self._gpus = list(zip(gpu_ordinals, mapped)) if mapped else []
            except Exception:  # noqa: BLE001 - no NVML library, driver or GPU: no GPU figures
                self._gpus = []

    def _add(self, key: str, value: float, now_ms: int) -> None:
        self.series.setdefault(key, []).append(float(value))
        self.times_ms.setdefault(key, []).append(now_ms)

    def sample(self) -> None:
        """One reading of every figure, stamped now."""
        now_ms = int(time.time() * 1000)
        with self._lock:  # the closing sample may meet the thread's last one
            if self._psutil is not None:
                try:
                    t, cpu_s = time.time(), _tree_cpu_s(self._proc)
                    # /proc counts CPU time in clock ticks (10 ms): over a span much shorter than
                    # the period (the closing sample, just after the thread's last) that is too
                    # coarse, so such a value spans back to the reading before.
                    older = [r for r in self._readings if t - r[0] >= MIN_SPAN_S]
                    t0, cpu0 = older[-1] if older else self._readings[0]
                    self._readings = (self._readings + [(t, cpu_s)])[-3:]
                    busy = 100.0 * (cpu_s - cpu0) / max(t - t0, 1e-6) / self._ncpu
                    self._add(CPU_KEY, min(100.0, max(0.0, busy)), now_ms)
                    mem = self._psutil.virtual_memory()
                    self._add(MEMORY_MB_KEY, mem.used / 1e6, now_ms)
                    self._add(MEMORY_PCT_KEY, mem.used / mem.total * 100, now_ms)
                except Exception:  # noqa: BLE001 - /proc unreadable: stop reading it
                    self._psutil = None
            for ordinal, h in self._gpus:
                keys = gpu_keys(ordinal)
                for name, read in (("util", lambda: self._nvml.nvmlDeviceGetUtilizationRates(h).gpu),
                                   ("mem", lambda: self._nvml.nvmlDeviceGetMemoryInfo(h).used / 1e6),
                                   ("power", lambda: self._nvml.nvmlDeviceGetPowerUsage(h) / 1e3)):
                    try:
                        self._add(keys[name], read(), now_ms)
                    except Exception:  # noqa: BLE001 - e.g. no power reading on this GPU
                        pass

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def __enter__(self) -> "SystemSampler":
        self.sample()
        self._thread = threading.Thread(target=self._run, name="fxtrack-system-metrics",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
