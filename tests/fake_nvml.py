"""A fake ``pynvml``: the functions fxtrack calls, over scripted GPUs (tests inject it as
``sys.modules["pynvml"]``). Each device's state is a plain dict the test edits mid-run; a
reading set to an exception instance raises it, as NVML does for an unsupported query."""

from __future__ import annotations

import types
from typing import Any


def gpu(bus_id: str, uuid: str, **state: Any) -> dict[str, Any]:
    """One H200-like device; ``state`` overrides any reading."""
    base = {"bus_id": bus_id, "uuid": uuid, "name": "NVIDIA H200", "mig": (0, 0),
            "persistence": 1, "power_limit_mw": 700_000, "power_default_mw": 700_000,
            "ecc": (1, 1), "app_clock": {1: 1980, 2: 3201}, "default_app_clock": {1: 1980, 2: 3201},
            "clock": {1: 1980, 2: 3201}, "temperature": 40, "reasons": 0, "energy_mj": 0,
            "power_mw": 500_000, "compute": {}, "graphics": {}, "util": 90, "mem_used": 10**9}
    base.update(state)
    return base


class FakeNvml(types.ModuleType):
    def __init__(self, devices: list[dict[str, Any]], driver: str = "570.86.15",
                 cuda: int = 12080) -> None:
        super().__init__("pynvml")
        self.devices, self.driver, self.cuda = devices, driver, cuda
        self.samples = 0  # calls of the compute-process list: the test's clock
        self.on_sample: list = []  # (after this many samples, function(fake)) run once each

    def _get(self, h: int, key: str) -> Any:
        value = self.devices[h][key]
        if isinstance(value, Exception):
            raise value
        return value

    def nvmlInit(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return types.SimpleNamespace(busId=self._get(h, "bus_id").encode())

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._get(h, "uuid")

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self._get(h, "name").encode()

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        return self._get(h, "mig")

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        return self._get(h, "persistence")

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return self._get(h, "power_limit_mw")

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: int) -> int:
        return self._get(h, "power_default_mw")

    def nvmlDeviceGetEccMode(self, h: int) -> tuple[int, int]:
        return self._get(h, "ecc")

    def nvmlDeviceGetApplicationsClock(self, h: int, clock: int) -> int:
        return self._get(h, "app_clock")[clock]

    def nvmlDeviceGetDefaultApplicationsClock(self, h: int, clock: int) -> int:
        return self._get(h, "default_app_clock")[clock]

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return self._get(h, "clock")[clock]

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self._get(h, "temperature")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._get(h, "reasons")

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        self.devices[h]["energy_mj"] += self.devices[h]["power_mw"] // 1000
        return self.devices[h]["energy_mj"]

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._get(h, "power_mw")

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return types.SimpleNamespace(gpu=self._get(h, "util"))

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return types.SimpleNamespace(used=self._get(h, "mem_used"))

    def _procs(self, h: int, key: str) -> list[Any]:
        return [types.SimpleNamespace(pid=p, usedGpuMemory=b)
                for p, b in self._get(h, key).items()]

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        self.samples += 1
        for entry in list(self.on_sample):
            if self.samples >= entry[0]:
                self.on_sample.remove(entry)
                entry[1](self)
        return self._procs(h, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[Any]:
        return self._procs(h, "graphics")


class MissingNvml(types.ModuleType):
    """pynvml installed, no driver: nvmlInit raises as the real one does (NVMLError)."""

    def __init__(self) -> None:
        super().__init__("pynvml")

    def nvmlInit(self) -> None:
        raise RuntimeError("NVML Shared Library Not Found")
