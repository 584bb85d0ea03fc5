"""NVML readings through the timed window: per-process peak GPU memory and energy.

Absent (None) wherever NVML or a GPU is missing: a figure that cannot be measured is never 0.
The worker sets CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA device i and NVML device i agree once
CUDA_VISIBLE_DEVICES is mapped.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Optional

SAMPLE_PERIOD_S = 0.02


def _nvml_index(cuda_index: int) -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    ids = [v for v in visible.split(",") if v.strip()]
    if ids and all(v.strip().isdigit() for v in ids):
        return int(ids[cuda_index])
    return cuda_index


class NvmlWindow:
    """Context manager: samples this process's GPU memory and reads the energy counter."""

    def __init__(self, cuda_index: int = 0, enabled: bool = True) -> None:
        self.handle: Any = None
        self.peak_bytes: Optional[int] = None
        self.energy_j: Optional[float] = None
        self.window_s: Optional[float] = None
        if not enabled:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(cuda_index))
        except Exception:  # noqa: BLE001 - no NVML library, no driver or no GPU: figures absent
            self.handle = None

    def _process_bytes(self) -> Optional[int]:
        pid = os.getpid()
        for proc in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
        return None

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                used = self._process_bytes()
            except Exception:  # noqa: BLE001 - e.g. not permitted inside some containers
                return
            if used is not None:
                self.peak_bytes = max(self.peak_bytes or 0, used)
            self._stop.wait(SAMPLE_PERIOD_S)

    def _energy_mj(self) -> Optional[int]:
        try:
            return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except Exception:  # noqa: BLE001 - pre-Volta GPUs have no energy counter
            return None

    def __enter__(self) -> "NvmlWindow":
        if self.handle is not None:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._energy0, self._t0 = self._energy_mj(), time.perf_counter()
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.handle is None:
            return
        self.window_s = time.perf_counter() - self._t0
        energy1 = self._energy_mj()
        self._stop.set()
        self._thread.join()
        if self._energy0 is not None and energy1 is not None:
            self.energy_j = (energy1 - self._energy0) / 1e3

    def metrics(self, samples: int) -> dict[str, float]:
        """``peak_mem_nvml_mib``, ``energy_j_per_sample``, ``power_w_mean`` where measured."""
        out: dict[str, float] = {}
        if self.peak_bytes:
            out["peak_mem_nvml_mib"] = self.peak_bytes / 2**20
        if self.energy_j is not None and self.window_s:
            out["energy_j_per_sample"] = self.energy_j / samples
            out["power_w_mean"] = self.energy_j / self.window_s
        return out
