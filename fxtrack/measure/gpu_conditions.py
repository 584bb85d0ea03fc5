"""The conditions a GPU run was measured under, read through NVML (docs/running-on-a-gpu.md).

A GPU figure is a property of the framework only when nothing else computed on the run's GPUs,
the clocks held, and the device did not throttle. So, on each GPU the run uses:

- foreign processes (NVML's compute and graphics lists, a pid counted once; the run's own
  processes, those of its session, left out), checked before the warm-up by ``precheck`` under
  ``hardware.gpu_isolation`` (warn | error | wait) and sampled through the timed window;
- the device's conditions (driver, CUDA, name, bus id, MIG, persistence, power limit, clocks,
  temperature at the window's start and end, ECC), as ``gpu.*`` tags;
- the clock-event (throttle) reasons through the window; power or thermal ones tag the run
  ``gpu_throttled``.

NVML missing or the devices unmappable: one ``gpu.nvml`` tag says why, never an error.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional, Sequence

ISOLATION = ("warn", "error", "wait")
POLL_S = 0.5  # between checks while waiting for the GPUs to go idle

# NVML's clocks-event (throttle) reason bits (nvml.h nvmlClocksEventReason*)
REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
           0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
           0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
           0x100: "display_clock_setting"}
# Those that lower the clocks below what the settings ask for: the figure is the cooling's or
# the power supply's, not the framework's.
THROTTLING = {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
              "hw_power_brake_slowdown"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def load() -> tuple[Optional[Any], str]:
    """(pynvml initialised, "") or (None, why it is unavailable)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, ""
    except Exception as e:  # noqa: BLE001 - no library, no driver, no GPU: said in a tag
        return None, f"unavailable: {type(e).__name__}: {e}"[:200]


def own_pids() -> set[int]:
    """This process and every process of its session (the worker runs in a session of its own:
    torchrun's ranks, DataLoader workers, compiler subprocesses), plus a torchrun rank's agent
    and its siblings. Processes in other containers' pid namespaces are not ours either way."""
    agent = os.getppid() if os.environ.get("TORCHELASTIC_RUN_ID") else None
    own = {os.getpid()} | ({agent} if agent else set())
    sid = os.getsid(0)
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return own
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[3]) == sid or (agent is not None and int(fields[1]) == agent):
            own.add(int(entry.name))
    return own


def foreign(nvml: Any, devices: Sequence[Any], mine: set[int]) -> dict[int, int]:
    """pid -> GPU bytes (0 when NVML does not say) of the processes on ``devices`` not in
    ``mine``. A pid in both the compute and the graphics list of a device counts once; one on
    several devices sums its memory over them."""
    out: dict[int, int] = {}
    for handle in devices:
        seen: dict[int, int] = {}
        for lister in ("nvmlDeviceGetComputeRunningProcesses",
                       "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                procs = getattr(nvml, lister)(handle)
            except Exception:  # noqa: BLE001 - an older driver without the graphics list
                continue
            for p in procs:
                if p.pid not in mine:
                    seen[p.pid] = max(seen.get(p.pid, 0), int(p.usedGpuMemory or 0))
        for pid, used in seen.items():
            out[pid] = out.get(pid, 0) + used
    return out


def describe(procs: dict[int, int]) -> str:
    """The tag's value: "pid:MiB" each, by pid."""
    return ",".join(f"{pid}:{used / 2**20:.0f}MiB" for pid, used in sorted(procs.items()))


def precheck(nvml: Any, devices: Sequence[Any], isolation: str, wait_s: float,
             say: Callable[[str], None] = print) -> dict[int, int]:
    """Before any work: the foreign processes on ``devices`` under ``isolation``. ``error``:
    raises when there are any; ``wait``: polls up to ``wait_s`` for them to go; ``warn``: says
    so. Returns those still there (the run is then contended)."""
    if isolation not in ISOLATION:
        raise ValueError(f"hardware.gpu_isolation must be one of {ISOLATION}, got {isolation!r}")
    mine = own_pids()
    procs = foreign(nvml, devices, mine)
    if procs and isolation == "error":
        raise RuntimeError(f"hardware.gpu_isolation=error: other processes use the run's GPUs "
                           f"({describe(procs)}); stop them or set gpu_isolation=warn|wait")
    if procs and isolation == "wait":
        say(f"[fxtrack] other processes on the run's GPUs ({describe(procs)}); waiting up to "
            f"{wait_s:.0f} s (hardware.wait_for_idle_s) for them to finish")
        deadline = time.monotonic() + wait_s
        while procs and time.monotonic() < deadline:
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
            procs = foreign(nvml, devices, mine)
    if procs:
        say(f"[fxtrack] WARNING: other processes use the run's GPUs ({describe(procs)}): "
            "its figures are tagged contended")
    return procs


UNMAPPED = ("unmapped: CUDA's devices cannot be matched to NVML's with certainty (a MIG "
            "instance, or CUDA_DEVICE_ORDER not PCI_BUS_ID on a multi-GPU host)")


def _read(read: Callable[[], Any]) -> Optional[Any]:
    try:
        return read()
    except Exception:  # noqa: BLE001 - not supported on this GPU or not permitted: left out
        return None


def _on_off(value: Any) -> Optional[str]:
    return None if value is None else ("enabled" if int(value) else "disabled")


def conditions(nvml: Any, devices: Sequence[tuple[int, Any]]) -> dict[str, str]:
    """``gpu.*`` tags of the host and of each (CUDA ordinal, handle); a reading the GPU does not
    offer is left out, never guessed."""
    tags: dict[str, Optional[str]] = {
        "gpu.driver_version": _read(lambda: _text(nvml.nvmlSystemGetDriverVersion())),
        "gpu.cuda_driver_version": _read(lambda: _cuda(nvml.nvmlSystemGetCudaDriverVersion())),
    }
    for i, h in devices:
        p = f"gpu.{i}."
        mig = _read(lambda: nvml.nvmlDeviceGetMigMode(h))
        ecc = _read(lambda: nvml.nvmlDeviceGetEccMode(h))
        limit = _read(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h))
        default = _read(lambda: nvml.nvmlDeviceGetPowerManagementDefaultLimit(h))
        tags.update({
            p + "name": _read(lambda: _text(nvml.nvmlDeviceGetName(h))),
            p + "bus_id": _read(lambda: _text(nvml.nvmlDeviceGetPciInfo(h).busId)),
            p + "mig_mode": _on_off(mig[0] if mig else None),
            p + "persistence_mode": _on_off(_read(lambda: nvml.nvmlDeviceGetPersistenceMode(h))),
            p + "power_limit_w": None if limit is None else f"{limit / 1e3:g}",
            p + "power_limit_default_w": None if default is None else f"{default / 1e3:g}",
            p + "ecc_mode": _on_off(ecc[0] if ecc else None),
        })
        for name, clock in (("sm", 1), ("mem", 2)):  # NVML_CLOCK_SM, NVML_CLOCK_MEM
            app = _read(lambda: nvml.nvmlDeviceGetApplicationsClock(h, clock))
            default_app = _read(lambda: nvml.nvmlDeviceGetDefaultApplicationsClock(h, clock))
            tags[p + f"applications_clock_{name}_mhz"] = None if app is None else str(app)
            tags[p + f"applications_clock_{name}_default_mhz"] = (
                None if default_app is None else str(default_app))
    return {k: v for k, v in tags.items() if v is not None}


def _cuda(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def reasons(mask: int) -> set[str]:
    return {name for bit, name in REASONS.items() if mask & bit}


class Watch:
    """Sampled by the NVML window's thread through the timed window: foreign processes, clock
    event reasons, clocks; temperature at the window's start and end."""

    def __init__(self, nvml: Any, devices: Sequence[tuple[int, Any]]) -> None:
        self.nvml, self.devices = nvml, list(devices)
        self.mine = own_pids()
        self.foreign: dict[int, int] = {}
        self.reasons: set[str] = set()
        self.clocks: dict[str, list[int]] = {}
        self.temps: dict[str, int] = {}

    def _temps(self, when: str) -> None:
        for i, h in self.devices:
            t = _read(lambda: self.nvml.nvmlDeviceGetTemperature(h, 0))  # NVML_TEMPERATURE_GPU
            if t is not None:
                self.temps[f"gpu.{i}.temperature_{when}_c"] = int(t)

    def start(self) -> None:
        self._temps("start")
        self.sample()

    def sample(self) -> None:
        for pid, used in foreign(self.nvml, [h for _, h in self.devices], self.mine).items():
            self.foreign[pid] = max(self.foreign.get(pid, 0), used)
        for i, h in self.devices:
            mask = _read(lambda: self._event_mask(h))
            if mask is not None:
                self.reasons |= reasons(int(mask))
            for name, clock in (("sm", 1), ("mem", 2)):
                mhz = _read(lambda: self.nvml.nvmlDeviceGetClockInfo(h, clock))
                if mhz is not None:
                    self.clocks.setdefault(f"gpu.{i}.{name}_clock_mhz", []).append(int(mhz))

    def _event_mask(self, h: Any) -> int:
        # renamed "clocks event" in NVML 12.2; older bindings have only the throttle name
        read = getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return read(h)

    def stop(self) -> None:
        self.sample()
        self._temps("end")

    @property
    def throttled(self) -> set[str]:
        return self.reasons & THROTTLING

    def tags(self) -> dict[str, str]:
        """The window's tags: temperatures, clocks (min-max), reasons seen, throttling, foreign
        processes."""
        out = {k: str(v) for k, v in self.temps.items()}
        for key, values in self.clocks.items():
            lo, hi = min(values), max(values)
            out[key] = str(lo) if lo == hi else f"{lo}-{hi}"
        out["gpu.clock_event_reasons"] = ",".join(sorted(self.reasons)) or "none"
        if self.throttled:
            out["gpu_throttled"] = ",".join(sorted(self.throttled))
        if self.foreign:
            out["gpu_foreign_processes"] = describe(self.foreign)
        return out
