"""How much of the CPU other processes took while fxtrack measured (docs/fairness.md).

A timing taken while another process competes for the cores is not a property of the framework:
PyTorch's OpenMP threads, for one, wait at every op on a thread the kernel descheduled. So the
load is measured, not assumed: ``/proc/stat`` gives each CPU's busy ticks; this process's
*session* gives fxtrack's own share (the worker runs in a session of its own, so the session holds
the worker, torchrun's ranks, DataLoader workers and compiler subprocesses; the test or shell
that started fxtrack is in another). Other work = busy time of the CPUs this process may use,
minus the session's own CPU time, plus steal (a hypervisor running someone else on our cores).

Linux only (``/proc``); elsewhere the sampler reports ``available = False`` and no metric, never a
made-up zero. Inside a container limited by a CPU quota rather than a cpuset, ``/proc/stat`` shows
the whole host's CPUs, so the figure then includes other containers' work on them.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Callable, ContextManager, Iterator, Optional

CONTENDED_FRAC = 0.10  # other work above this share of fxtrack's cores tags a run contended
PROBE_S = 0.5  # the quiet probe before the timed window: 0.5 s is 50 ticks per core at 100 Hz
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # ticks per second in /proc


def is_contended(frac: Optional[float]) -> bool:
    """True when other processes took more than CONTENDED_FRAC of fxtrack's cores."""
    return frac is not None and frac > CONTENDED_FRAC


def _cpus() -> set[int]:
    """The CPU ids this process may run on (its affinity), else all of them."""
    from fxtrack.policy import allowed_cpus

    return set(allowed_cpus())


def _cpu_ticks(cpus: set[int]) -> tuple[int, int]:
    """(busy ticks, steal ticks) summed over ``cpus`` from /proc/stat's ``cpuN`` lines.

    Busy = user + nice + system + irq + softirq (guest time is already inside user); idle and
    iowait are not busy; steal is counted apart because no process on this host spent it.
    """
    busy = steal = 0
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu") or line.startswith("cpu "):
                continue
            name, *fields = line.split()
            if int(name[3:]) not in cpus:
                continue
            v = [int(x) for x in fields] + [0] * 8  # old kernels have fewer columns
            busy += v[0] + v[1] + v[2] + v[5] + v[6]
            steal += v[7]
    return busy, steal


def _session_ticks(sid: int, agent: Optional[int] = None, pids: tuple[int, ...] = ()) -> int:
    """CPU ticks (user + system, plus those of reaped children) of every process in session
    ``sid``, and, for a torchrun rank (``agent``: the torchrun agent's pid), also in the agent's
    session and in each session led by one of the agent's children: torchrun starts every rank
    in a session of its own, and the other ranks are fxtrack's work, not competition.

    Reaped children's time moves into their parent's cutime/cstime, so summing all four over the
    live members keeps a process that exits inside the window accounted for in the difference.
    """
    procs = []  # (ppid, session, ticks, pid)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:  # gone since the listing, or not ours to read
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # the command name may hold spaces
        # after the name: state(0) ppid(1) pgrp(2) session(3) ... utime(11) stime(12) cutime(13) cstime(14)
        procs.append((int(fields[1]), int(fields[3]), sum(int(x) for x in fields[11:15]),
                      int(entry.name)))
    sids = {sid}
    if agent is not None:
        sids |= {s for ppid, s, _, pid in procs if ppid == agent or pid == agent}
    return sum(ticks for _, s, ticks, pid in procs if s in sids or pid in pids)


def _children_ticks() -> float:
    """CPU time of this process and of its reaped children, in ticks: what a caller that waits
    on its own subprocess (calibration's probe) spent, whichever session it was started from."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return (own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime) * _HZ


class _Snapshot:
    def __init__(self, cpus: set[int], sid: int, agent: Optional[int], children: bool = False,
                 pids: tuple[int, ...] = ()):
        self.t = time.monotonic()
        self.busy, self.steal = _cpu_ticks(cpus)
        self.own = _children_ticks() if children else _session_ticks(sid, agent, pids)


class LoadSampler:
    """Measures other processes' CPU use between ``start()`` and ``stop()`` (or ``with``).

    ``threads``: how many cores fxtrack's worker uses (spec.cpu_threads; None: every core it may
    run on). Other work that fits on the cores fxtrack leaves free does not compete with it, so
    only the excess over that spare capacity counts.

    After stop: ``other_cpu_frac`` (0..1 of fxtrack's cores), ``steal_frac`` (0..1 of the allowed
    cores), ``loadavg`` (1-minute, at stop; it counts fxtrack's own threads too), ``window_s``.
    Each is None when /proc cannot be read.
    """

    def __init__(self, threads: Optional[int] = None, children: bool = False,
                 pids: tuple[int, ...] = ()):
        # children: fxtrack's own work is this process and the children it reaps in the window
        # (calibration's probe worker, waited on), not its session: a shell's background jobs
        # share that session and were counted as fxtrack's, so a probe under two busy loops
        # read quiet and was cached (issue 61)
        self.children = children
        self.pids = pids  # more processes whose CPU is fxtrack's own (the orchestrator's)
        self.cpus = _cpus()
        self.threads = min(threads or len(self.cpus), len(self.cpus))
        self.sid = os.getsid(0)
        # torchrun sets TORCHELASTIC_RUN_ID in each rank; the rank's parent is its agent
        self.agent = os.getppid() if os.environ.get("TORCHELASTIC_RUN_ID") else None
        self.available = os.path.exists("/proc/stat")
        self.other_cpu_frac: Optional[float] = None
        self.steal_frac: Optional[float] = None
        self.loadavg: Optional[float] = None
        self.window_s: Optional[float] = None
        self._start: Optional[_Snapshot] = None

    def start(self) -> "LoadSampler":
        if self.available:
            try:
                self._start = _Snapshot(self.cpus, self.sid, self.agent, self.children, self.pids)
            except (OSError, ValueError):
                self.available = False
        return self

    def stop(self) -> "LoadSampler":
        if self._start is None:
            return self
        try:
            end = _Snapshot(self.cpus, self.sid, self.agent, self.children, self.pids)
        except (OSError, ValueError):
            self.available = False
            return self
        s = self._start
        wall = max(end.t - s.t, 1e-9)
        own_s = (end.own - s.own) / _HZ
        steal_s = (end.steal - s.steal) / _HZ
        other_s = max(0.0, (end.busy - s.busy) / _HZ - own_s) + steal_s
        spare_s = (len(self.cpus) - self.threads) * wall  # cores fxtrack leaves to others
        frac = max(0.0, other_s - spare_s) / (self.threads * wall)
        self.other_cpu_frac = min(1.0, frac)
        self.steal_frac = min(1.0, steal_s / (len(self.cpus) * wall))
        self.window_s = wall
        self.loadavg = os.getloadavg()[0]
        return self

    def __enter__(self) -> "LoadSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def contended(self) -> bool:
        return is_contended(self.other_cpu_frac)

    def metrics(self, prefix: str = "host_") -> dict[str, float]:
        """The figures as metric keys (absent, not zero, when not measured)."""
        out = {f"{prefix}other_cpu_frac": self.other_cpu_frac, f"{prefix}steal_frac": self.steal_frac,
               f"{prefix}loadavg_1m": self.loadavg}
        return {k: float(v) for k, v in out.items() if v is not None}


_SINCE_START: list[LoadSampler] = []  # sampling since the worker started (start_sampling)


def start_sampling(threads: Optional[int], orchestrator: Optional[int]) -> None:
    """Sample other processes' CPU use from now (the worker's start) until its first window
    opens: its imports and build take seconds, so that span replaces the 0.5 s probe before the
    window (issue 61: half of a tiny job's fixed cost). ``orchestrator``: its pid, whose own
    CPU (loading MLflow beside the build) is fxtrack's, not competition; it is in another
    session, which may also hold a shell's background jobs, so it counts as one process."""
    _SINCE_START[:] = [LoadSampler(threads, pids=(orchestrator,) if orchestrator else ()).start()]


def since_start() -> Optional[LoadSampler]:
    """The sampler start_sampling began, stopped now, once (a later window probes); None where
    none was started or its span was shorter than the probe it replaces."""
    if not _SINCE_START:
        return None
    sampler = _SINCE_START.pop().stop()
    if sampler.window_s is None or sampler.window_s < PROBE_S:
        return None
    return sampler


def probe(seconds: float = PROBE_S, threads: Optional[int] = None) -> LoadSampler:
    """Sample for ``seconds`` while this process sleeps (so its own share is ~0)."""
    sampler = LoadSampler(threads).start()
    time.sleep(seconds)
    return sampler.stop()


def wait_for_idle(max_s: float, threads: Optional[int] = None,
                  say: Callable[[str], None] = print) -> LoadSampler:
    """Probe until other work drops to CONTENDED_FRAC or ``max_s`` seconds have passed, narrating
    the wait; returns the last probe (its ``contended`` says whether the wait succeeded)."""
    deadline = time.monotonic() + max_s
    last = since_start() or probe(threads=threads)
    if last.contended and max_s > 0:
        say(f"[fxtrack] other processes use {last.other_cpu_frac:.0%} of the cores; "
            f"waiting up to {max_s:.0f} s for the machine to go quiet")
    while last.contended and time.monotonic() < deadline:
        last = probe(seconds=min(1.0, max(0.1, deadline - time.monotonic())), threads=threads)
    if max_s > 0:
        state = ("still busy" if last.contended else "quiet") if last.available else "unmeasurable"
        say(f"[fxtrack] machine {state} ({_pct(last.other_cpu_frac)} other CPU use) after "
            f"{max_s - max(0.0, deadline - time.monotonic()):.1f} s")
    return last


@contextlib.contextmanager
def sampling(sampler: LoadSampler, inner: Optional[ContextManager] = None) -> Iterator[None]:
    """``sampler`` around ``inner`` (e.g. the NVML window): one ``window`` for time_steps."""
    with sampler, inner or contextlib.nullcontext():
        yield


SHORT_WINDOW_S = 1.0  # below this the window's own figure rests on too few clock ticks


def window_figures(before: LoadSampler, during: LoadSampler) -> tuple[dict[str, float], bool]:
    """The metrics of the probe before and the sampler during the timed window, and whether
    the run counts as contended: by the window's own figure, and also by the probe before it
    when the window was too short for its ticks to be trusted alone."""
    out = during.metrics()
    if before.other_cpu_frac is not None:
        out["host_other_cpu_frac_before"] = float(before.other_cpu_frac)
    short = during.window_s is None or during.window_s < SHORT_WINDOW_S
    return out, during.contended or (short and before.contended)


def _pct(frac: Optional[float]) -> str:
    return "n/a" if frac is None else f"{frac:.0%}"
