"""NVML readings through the timed window: per-process peak GPU memory and energy, over every
local GPU the run uses.

Which GPUs: the caller names CUDA ordinals (0 = the first GPU this process sees). They are mapped
to NVML devices by PCI bus id: with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (the worker sets it) CUDA
numbers the devices in PCI bus order, so ordinal i is the i-th entry of ``CUDA_VISIBLE_DEVICES``
(an index into the PCI-ordered list, or a GPU UUID, possibly shortened) or, when that is unset,
the i-th NVML device sorted by bus id. NVML's own index order is not promised to be CUDA's.
MIG instances have no energy counter of their own: with a MIG UUID the figures are absent.

Absent (None) wherever NVML or a GPU is missing, or the mapping is unsure: a figure that cannot be
measured is never 0. Energy is absent unless the counter advanced on every device measured.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Optional, Sequence

from fxtrack.measure import gpu_conditions

SAMPLE_PERIOD_S = 0.02


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus_id(nvml: Any, handle: Any) -> str:
    """"00000000:3B:00.0" (domain:bus:device.function), upper case: sorts in PCI order."""
    return _text(nvml.nvmlDeviceGetPciInfo(handle).busId).upper()


def handles(nvml: Any, ordinals: Sequence[int]) -> Optional[list[Any]]:
    """NVML handles of the CUDA devices ``ordinals`` of this process, or None when they cannot
    be told apart with certainty (see the module docstring)."""
    everything = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    by_bus = sorted(everything, key=lambda h: _bus_id(nvml, h))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = None if visible is None else [v.strip() for v in visible.split(",") if v.strip()]
    order = os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    out = []
    for ordinal in ordinals:
        if entries is None:
            entry = str(ordinal)
        else:
            entry = entries[ordinal] if ordinal < len(entries) else ""
        if entry.isdigit():
            if order != "PCI_BUS_ID" and len(everything) > 1:
                return None  # CUDA's fastest-first order is not NVML's: no sure mapping
            if int(entry) >= len(by_bus):
                return None
            out.append(by_bus[int(entry)])
        elif entry.upper().startswith("GPU-"):  # a UUID, or a unique prefix of one (CUDA allows)
            match = [h for h in everything
                     if _text(nvml.nvmlDeviceGetUUID(h)).upper().startswith(entry.upper())]
            if len(match) != 1:
                return None
            out.append(match[0])
        else:  # "MIG-...", or an entry CUDA would stop at
            return None
    return out


def check_before(ordinals: Sequence[int], isolation: str, wait_s: float,
                 say: Callable[[str], None] = print) -> dict[str, str]:
    """The pre-check of a GPU run, before its build and warm-up: ``gpu_foreign_processes`` when
    other processes stay on its GPUs (gpu_conditions.precheck), or ``gpu.nvml`` saying why
    nothing could be checked. Raises only for ``isolation=error`` with foreign processes present."""
    if isolation not in gpu_conditions.ISOLATION:
        raise ValueError(f"hardware.gpu_isolation must be one of {gpu_conditions.ISOLATION}, "
                         f"got {isolation!r}")
    nvml, why = gpu_conditions.load()
    if nvml is None:
        return {"gpu.nvml": why}
    try:
        devices = handles(nvml, list(ordinals))
    except Exception as e:  # noqa: BLE001 - e.g. not permitted inside some containers
        return {"gpu.nvml": f"unreadable: {type(e).__name__}: {e}"[:200]}
    if devices is None:
        return {"gpu.nvml": gpu_conditions.UNMAPPED}
    procs = gpu_conditions.precheck(nvml, devices, isolation, wait_s, say)
    return {"gpu_foreign_processes_before": gpu_conditions.describe(procs)} if procs else {}


class NvmlWindow:
    """Context manager over the timed window: samples this process's memory on each of
    ``memory_ordinals`` (the devices it computes on) and reads the energy counters of
    ``energy_ordinals`` (the devices whose energy it accounts for; see scenarios/timed.py)."""

    def __init__(self, memory_ordinals: Sequence[int] = (0,),
                 energy_ordinals: Optional[Sequence[int]] = None, enabled: bool = True) -> None:
        self.memory: list[Any] = []
        self.energy: list[Any] = []
        self.peak_bytes: Optional[int] = None  # the fullest of this process's devices
        self.energy_j: Optional[float] = None  # summed over the energy devices
        self.window_s: Optional[float] = None
        self._started = False
        # the run's conditions (measure/gpu_conditions.py): read over the devices it computes on
        self.watch: Optional[gpu_conditions.Watch] = None
        self.state: dict[str, str] = {}  # gpu.nvml: why nothing was read, when nothing was
        self.conditions: dict[str, str] = {}
        if not enabled:
            return
        energy_ordinals = memory_ordinals if energy_ordinals is None else energy_ordinals
        pynvml, why = gpu_conditions.load()
        mapped = None
        if pynvml is None:
            self.state = {"gpu.nvml": why}
        else:
            self.nvml = pynvml
            try:
                mapped = handles(pynvml, sorted(set(memory_ordinals) | set(energy_ordinals)))
            except Exception as e:  # noqa: BLE001 - e.g. not permitted: figures absent
                self.state = {"gpu.nvml": f"unreadable: {type(e).__name__}: {e}"[:200]}
            else:
                if mapped is None:
                    self.state = {"gpu.nvml": gpu_conditions.UNMAPPED}
        if mapped is not None:
            found = dict(zip(sorted(set(memory_ordinals) | set(energy_ordinals)), mapped))
            self.memory = [found[i] for i in memory_ordinals]
            self.energy = [found[i] for i in energy_ordinals]
            used = [(i, found[i]) for i in memory_ordinals]
            self.conditions = gpu_conditions.conditions(pynvml, used)
            self.watch = gpu_conditions.Watch(pynvml, used)

    def _process_bytes(self, handle: Any) -> Optional[int]:
        pid = os.getpid()
        for proc in self.nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
        return None

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                used = [self._process_bytes(h) for h in self.memory]
            except Exception:  # noqa: BLE001 - e.g. not permitted inside some containers
                return
            if self.watch is not None:
                try:
                    self.watch.sample()
                except Exception:  # noqa: BLE001 - a reading NVML refuses: no watch, no crash
                    self.watch = None
            for u in used:
                if u is not None:
                    self.peak_bytes = max(self.peak_bytes or 0, u)
            self._stop.wait(SAMPLE_PERIOD_S)

    def _energy_mj(self) -> Optional[list[int]]:
        """Each energy device's counter since driver load, millijoules; None if any is missing."""
        try:
            return [int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self.energy]
        except Exception:  # noqa: BLE001 - pre-Volta GPUs have no energy counter
            return None

    def __enter__(self) -> "NvmlWindow":
        if self.memory or self.energy:
            self._started = True
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            if self.watch is not None:
                self.watch.start()
            self._energy0, self._t0 = self._energy_mj(), time.perf_counter()
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._started:
            return
        self.window_s = time.perf_counter() - self._t0
        energy1 = self._energy_mj()
        self._stop.set()
        self._thread.join()
        if self.watch is not None:
            self.watch.stop()
        if self.energy and self._energy0 is not None and energy1 is not None:
            deltas = [b - a for a, b in zip(self._energy0, energy1)]
            # A counter that did not move (a window shorter than its update period) would
            # understate the energy: then no figure at all.
            if all(d > 0 for d in deltas):
                self.energy_j = sum(deltas) / 1e3

    def tags(self) -> dict[str, str]:
        """The ``gpu.*``, ``gpu_throttled`` and ``gpu_foreign_processes`` tags of the window, or
        ``gpu.nvml`` saying why there are none."""
        out = {**self.state, **self.conditions}
        if self.watch is not None and self._started:
            out.update(self.watch.tags())
        return out

    def metrics(self, samples: int) -> dict[str, float]:
        """``peak_mem_nvml_mib``, ``energy_j_per_sample``, ``power_w_mean`` (all the energy
        devices together, over this window) where measured."""
        out: dict[str, float] = {}
        if self.peak_bytes:
            out["peak_mem_nvml_mib"] = self.peak_bytes / 2**20
        if self.energy_j and self.window_s:
            out["energy_j_per_sample"] = self.energy_j / samples
            out["power_w_mean"] = self.energy_j / self.window_s
        return out
