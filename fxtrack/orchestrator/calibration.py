"""Peak FLOP/s calibration: each declared framework's large-matmul rate, measured in its own worker,
and the MFU a run gets against the datasheet (fxtrack.measure.peak) or, without one (a CPU, an
unknown GPU), against the machine's yardstick: the fastest rate any framework's quiet probe
measured on this machine and precision (tag ``peak_tflops_source=machine-best:<framework>``).

Each framework's worker sizes its matmul to the device and takes the best of three timings
(``fxtrack.measure.matmul_probe``). All frameworks of one precision share a time budget
(``BUDGET_S``): each probe sizes its matmul to an equal share of what is left (its deadline) and
is stopped where it runs into the time the later frameworks need at least (``FLOOR_S`` each); a
stopped framework has no rate (not cached, so a later command tries again), and where the peak
is a measured one its runs log no MFU. One progress line per framework goes to
stderr. A framework is probed again (up to ``TRIALS`` probes) only where every probe so far was
contended or failed, and only with budget left over once every framework had its first probe.

A calibration taken while other processes used the cores (``fxtrack.measure.host_load``) serves
the run that asked for it but is never cached. A framework whose worker answers without
``tflops`` gives no calibration: it is neither a failure nor cached. Every framework's own rate
is logged too (``framework_matmul_tflops``), so a framework that leaves the hardware unused
shows it.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from filelock import FileLock, Timeout

from fxtrack.measure import matmul_probe, peak
from fxtrack.measure.host_load import LoadSampler, is_contended
from fxtrack.paths import config_dirs

TRIALS = 3  # worker probes per framework at most; the best counts (other work only lowers a rate)
# Seconds for every framework's probe at one precision together. A GPU's frameworks start CUDA,
# cuBLAS and autotuning first (seconds each), and a GPU with a datasheet entry only loses the
# per-framework rate (framework_matmul_tflops) when one is stopped. The GPU figure is a margin
# chosen without a GPU measurement; the CPU one is issue 26's target.
BUDGET_S = {"cpu": 30.0, "gpu": 120.0}
EXIT_S = 1.0  # of each probe's share: for its worker to print and exit after the last timing
# A probe's matmul is sized to an equal share of the time left; a slow start (a framework's
# import on a busy machine) may run on into the rest, less this floor for each framework after it.
FLOOR_S = 4.0
LOCK_TIMEOUT_S = 60  # waiting longer for another process's cache write: this run's entries go uncached
_FAILED = object()  # the measurement failed: not cached, tried again next time
MACHINE = "machine-best:"  # peak_tflops_source of the machine's yardstick: which framework set it
# Entries this process measured but did not cache (contended, "not installed" for an interpreter
# that is not the framework's, no calibration): every run of one sweep still divides by one peak.
_UNCACHED: dict[str, dict[str, dict[str, Any]]] = {}


def frameworks() -> list[str]:
    """The frameworks the config directories declare (``framework/*.yaml`` with a ``package``):
    fxtrack's own first, then the user's, each sorted."""
    from fxtrack.config.frameworks import packages

    return list(packages())


def framework_package(framework: str) -> str:
    """What the worker's probe command names the framework's code by: its YAML's ``package``
    (e.g. ``fxtrack.frameworks.torch``), from the first config directory that has the YAML."""
    from fxtrack.config.frameworks import packages

    found = packages()
    if framework not in found:
        raise FileNotFoundError(f"no framework/{framework}.yaml with a package in "
                                f"{', '.join(map(str, config_dirs()))}")
    return found[framework]


def ask_worker(what: str, framework: str, python: Optional[str], precision: str = "fp32",
               hardware: str = "auto", timeout_s: float = 600,
               threads: Optional[int] = None) -> Optional[dict]:
    """Ask ``framework``'s worker (``python -m fxtrack.worker --describe|--matmul``) under
    ``python``; its JSON answer, or None when the worker failed or ran past ``timeout_s``.
    ``threads``: the worker may run on only the first ``threads`` of this process's cores (its
    affinity, which the worker's thread pools follow)."""
    return _ask(what, framework, python, precision, hardware, timeout_s, threads)[0]


def _ask(what: str, framework: str, python: Optional[str], precision: str, hardware: str,
         timeout_s: float, threads: Optional[int],
         deadline_s: Optional[float] = None) -> tuple[Optional[dict], bool]:
    """(ask_worker's answer, whether the worker was stopped at ``timeout_s``). ``deadline_s``:
    seconds the worker's matmul probe may take from now (``matmul_probe.DEADLINE_ENV``)."""
    cmd = [python or sys.executable, "-m", "fxtrack.worker", f"--{what}", framework,
           framework_package(framework), precision, hardware]
    from fxtrack.environment import worker_environment  # a worker's: no secrets in it

    env = worker_environment(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")]))
    if deadline_s is not None:  # wall-clock seconds: the only clock both processes share
        env[matmul_probe.DEADLINE_ENV] = repr(time.time() + deadline_s)
    cpus = peak.cpus()
    cores = cpus[:threads] if threads and threads < len(cpus) else None
    preexec = None
    if cores and hasattr(os, "sched_setaffinity"):
        preexec = lambda: os.sched_setaffinity(0, cores)  # noqa: E731 - runs in the child
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env,
                             preexec_fn=preexec)
    except subprocess.TimeoutExpired:  # subprocess.run has killed the worker
        return None, True
    except (OSError, subprocess.SubprocessError):
        return None, False
    lines = out.stdout.strip().splitlines()
    return (json.loads(lines[-1]) if out.returncode == 0 and lines else None), False


def _trial(framework: str, python: Optional[str], precision: str, hardware: str,
           threads: int, deadline_s: float, timeout_s: float
           ) -> tuple[Optional[dict], Optional[float]]:
    """One matmul probe, its timings done within ``deadline_s`` seconds, stopped after
    ``timeout_s``: (the worker's answer, ``{"stopped": True}`` when it was stopped, or None when
    it failed; other processes' share of the probe's cores meanwhile, 0..1, None where /proc
    cannot be read)."""
    with LoadSampler(threads, children=True) as load:
        answer, stopped = _ask("matmul", framework, python, precision, hardware, timeout_s,
                               threads, deadline_s=max(0.0, deadline_s - EXIT_S))
    return ({"installed": True, "stopped": True} if stopped else answer), load.other_cpu_frac


class _Probes:
    """One framework's probes so far, and the cache entry they make."""

    def __init__(self, python: Optional[str], cpu: bool) -> None:
        self.python, self.cpu = python, cpu
        self.best: Optional[float] = None
        self.fracs: list[Optional[float]] = []
        self.quiet = False
        self.entry: Optional[dict] = None  # final: not installed, no calibration, stopped
        self.seconds = 0.0  # the last probe's wall time

    def add(self, answer: Optional[dict], frac: Optional[float], budget: str) -> str:
        """Record one probe's answer; what the progress line says about it."""
        base = {"date": _now(), "other_cpu_frac": frac, "contended": False,
                "python": self.python or sys.executable}
        took = f"({self.seconds:.1f} s)"
        if answer is None:
            return f"its worker failed {took}"
        if not answer["installed"]:
            self.entry = dict(base, tflops=None)
            return f"not installed for {base['python']} {took}"
        if answer.get("stopped"):
            # Not cached: a quieter machine, or a later command with fewer frameworks, may fit.
            self.entry = dict(base, tflops=None, stopped=budget)
            return (f"{budget}: no rate from this "
                    "framework (not cached); where the peak is measured, its runs log no MFU")
        if "tflops" not in answer:  # no calibration capability: asking again would say the same
            self.entry = dict(base, tflops=None, calibrates=False,
                              reason=answer.get("reason", ""))
            return f"no calibration: {answer.get('reason', '')}"
        self.best = max(self.best or 0.0, answer["tflops"] or 0.0)
        self.fracs.append(frac)
        busy = self.cpu and is_contended(frac)  # only a CPU probe competes with other work
        self.quiet = self.quiet or not busy
        note = "" if answer.get("native_precision") is not False else (
            "; no native support on this device: measured as it runs")
        return f"{answer['tflops'] or 0.0:.3g} TFLOP/s {took}" + (", contended" if busy else "") \
            + note

    @property
    def again(self) -> bool:
        """Worth another probe: no answer was final and none quiet."""
        return self.entry is None and not self.quiet

    def result(self):
        """The cache entry ``{"tflops", "date", "other_cpu_frac", "contended"}`` (tflops None:
        not installed for ``python``, stopped at its budget (``"stopped"``), or, with
        ``"calibrates": False``, the framework gives no calibration), or _FAILED."""
        if self.entry is not None:
            return self.entry
        if not self.best:
            return _FAILED
        return {"tflops": self.best, "date": _now(), "contended": not self.quiet,
                "other_cpu_frac": max((f for f in self.fracs if f is not None), default=None)}


def _measure_all(frameworks_: list[str], pythons: dict[str, Optional[str]], precision: str,
                 hardware: str, threads: int, cpu: bool, budget_s: float) -> dict[str, Any]:
    """Every framework's best probe within ``budget_s`` seconds together, as cache entries
    (or _FAILED). First one probe each, its matmul sized to an equal share of the time left
    (stopped past that share plus what the later frameworks' floors leave); then, while time
    is left, another for those whose probes were all contended or failed, where their last
    probe's time fits in what is left."""
    start = time.monotonic()
    probes = {fw: _Probes(pythons.get(fw), cpu) for fw in frameworks_}

    def left() -> float:
        return budget_s - (time.monotonic() - start)

    for trial in range(TRIALS):
        todo = frameworks_ if trial == 0 else [
            fw for fw in frameworks_ if probes[fw].again and probes[fw].seconds <= left()]
        for i, fw in enumerate(todo):
            later = len(todo) - i - 1
            share = left() / (later + 1)
            if share <= EXIT_S and trial:
                break
            again = " again" if trial else ""
            print(f"[fxtrack] calibrating peak FLOP/s: {fw} {precision}{again} ... ", end="",
                  file=sys.stderr, flush=True)
            if share <= EXIT_S:  # kept for this process, so a sweep's next run does not wait
                probes[fw].entry = {"tflops": None, "date": _now(), "other_cpu_frac": None,
                                    "contended": False, "python": pythons.get(fw) or sys.executable,
                                    "stopped": f"not probed: the {budget_s:.0f} s budget was spent"}
                print(f"not probed: the {budget_s:.0f} s calibration budget was spent (not "
                      "cached)", file=sys.stderr, flush=True)
                continue
            t0 = time.monotonic()
            stop = max(share, left() - FLOOR_S * later)
            answer, frac = _trial(fw, pythons.get(fw), precision, hardware, threads, share, stop)
            probes[fw].seconds = time.monotonic() - t0
            budget = f"stopped at {stop:.1f} s of the {budget_s:.0f} s calibration budget"
            print(probes[fw].add(answer, frac, budget), file=sys.stderr, flush=True)
    return {fw: p.result() for fw, p in probes.items()}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def store(key: str, entries: dict[str, dict[str, Any]], replace: bool = False) -> bool:
    """Merge ``entries`` into the cache under ``key`` (``replace``: instead of the key's old
    entries). Read, merge and write happen under one file lock, so concurrent runs calibrating
    different devices or frameworks keep each other's entries. False if the lock stayed busy."""
    path = peak.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(f"{path}.lock", timeout=LOCK_TIMEOUT_S):
            cache = peak.cached()
            cache[key] = dict({} if replace else cache.get(key, {}), **entries)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cache, indent=1))
            tmp.replace(path)  # readers (peak.cached) take no lock: they see old or new, whole
    except Timeout:
        return False
    return True


def calibrate(device: str, precision: str, hardware: str, pythons: dict[str, Optional[str]],
              refresh: bool = False, threads: Optional[int] = None,
              budget_s: Optional[float] = None,
              only: Optional[list[str]] = None) -> dict[str, dict[str, Any]]:
    """Every framework's matmul entry on ``device`` at ``precision`` (``tflops`` None: not
    installed, no calibration, or stopped at the budget), from the cache, measuring the missing
    ones (all of them when ``refresh``) within ``budget_s`` seconds (None: ``BUDGET_S`` of the
    device kind); ``only``: just these frameworks (a run needs its own).

    ``pythons``: each framework's configured interpreter (None: this one). A framework absent from
    it is probed with this interpreter; if that says "not installed", the answer serves this
    process only: the framework may live in a venv of its own that this run was not told about.
    A cached "not installed" is kept with the interpreter that said it, and asked again when a
    run configures another one.
    """
    threads = peak.thread_count(threads)
    key, path = peak.cache_key(device, precision, threads), peak.cache_path()
    if refresh:
        _UNCACHED.pop(key, None)
    entries = {} if refresh else {**_UNCACHED.get(key, {}), **peak.cached().get(key, {})}
    for fw, python in pythons.items():  # "not installed" holds only for the interpreter asked
        if fw in entries and entries[fw]["tflops"] is None and \
                entries[fw].get("python") != (python or sys.executable):
            del entries[fw]
    missing = [fw for fw in (only or frameworks()) if fw not in entries]
    if not missing:
        return entries
    cpu = hardware == "cpu" or device == "cpu"
    budget_s = BUDGET_S["cpu" if cpu else "gpu"] if budget_s is None else budget_s
    print(f"[fxtrack] calibrating peak FLOP/s on {device} at {precision} ({threads} threads) with "
          f"{', '.join(missing)}, at most {budget_s:.0f} s (cached in {path})", file=sys.stderr,
          flush=True)
    measured = _measure_all(missing, pythons, precision, hardware, threads, cpu, budget_s)
    measured = {fw: e for fw, e in measured.items() if e is not _FAILED}
    entries.update(measured)
    keep = {fw: e for fw, e in measured.items()
            if not e["contended"] and e.get("calibrates", True) and "stopped" not in e
            and (e["tflops"] is not None or fw in pythons)}
    busy = [fw for fw, e in measured.items() if e["contended"]]
    if busy:
        print(f"[fxtrack] other processes used the cores while calibrating {', '.join(busy)} "
              "(every trial contended): used by this process's runs, not cached",
              file=sys.stderr, flush=True)
    # A refresh of only some frameworks (a run that outran its cached peak) replaces theirs:
    # replacing the whole key dropped every other framework's peak mid-table (2026-12-06).
    if keep and not store(key, keep, replace=refresh and only is None):
        print(f"[fxtrack] {path}.lock stayed busy for {LOCK_TIMEOUT_S} s: this calibration is "
              "used by this process's runs, not cached", file=sys.stderr, flush=True)
        keep = {}
    _UNCACHED.setdefault(key, {}).update({fw: e for fw, e in measured.items() if fw not in keep})
    return entries


def _rate(entries: dict[str, dict[str, Any]], fw: str) -> float:
    return (entries.get(fw) or {}).get("tflops") or 0.0


def yardstick(entries: dict[str, dict[str, Any]]) -> Optional[tuple[str, dict[str, Any]]]:
    """The machine's yardstick among a device's and precision's entries: the framework whose
    quiet, whole probe read the fastest large-matmul rate, and its entry; None where no probe
    was quiet. A contended or stopped probe measured what other work left, not the machine."""
    quiet = [(fw, e) for fw, e in entries.items()
             if e.get("tflops") and not e.get("contended") and not e.get("stopped")]
    return max(quiet, key=lambda item: item[1]["tflops"]) if quiet else None


def preflight(framework: str, python: Optional[str], precision: str, hardware: str,
              threads: Optional[int], timed: bool) -> None:
    """Before the job's worker starts: its framework's peak at its precision on this CPU,
    probed now where the cache has none, so no probe runs after the job (mfu_metrics then
    reads the cache). ``timed``: the run times compute (Scenario.mfu). A GPU's device name is
    the worker's to tell: its probe stays after the job."""
    if timed and hardware == "cpu":
        calibrate("cpu", precision, "cpu", {framework: python}, threads=threads, only=[framework])


def mfu_metrics(framework: str, device: str, precision: str, hardware: str, devices: int,
                achieved_tflops: float, pythons: dict[str, Optional[str]],
                threads: Optional[int] = None) -> tuple[dict[str, float], dict[str, str]]:
    """(``peak_tflops``, ``framework_matmul_tflops``, ``own_matmul_share``, ``mfu``) and the
    tags that qualify them: ``peak_tflops_source``, ``peak_calibrated`` (the measured peak's
    UTC date), ``mfu_over_1`` (an MFU above 1 is impossible: the peak or the FLOP count is
    wrong; never logged silently), ``peak_contended`` (no quiet probe on this machine yet: the
    run's own framework's rate is what other processes left over, so no ``mfu``),
    ``calibration_stopped`` (this framework's probe ran past its share of the calibration
    budget).

    Without a datasheet the yardstick is the machine's: the fastest large-matmul rate any
    framework's quiet probe measured on this device at this precision (``machine-best:<fw>``).
    MFU says how close a run gets to what the hardware can do, so a framework that cannot reach
    the machine's matmul rate shows it; its own rate stays beside it (``framework_matmul_tflops``,
    and ``own_matmul_share``: the run's rate against it). Only the run's own framework is probed
    here; ``fxtrack doctor --calibrate`` probes every installed one, and another framework's
    probe only ever raises the yardstick, named with its date (issue 61)."""
    only = [framework]
    entries = calibrate(device, precision, hardware, pythons, threads=threads, only=only)
    sheet = peak.datasheet(device, precision)
    best = yardstick(entries)
    if not sheet and best and achieved_tflops / devices > best[1]["tflops"]:
        # A model outran the "peak": the calibration ran on a busy machine. Measure again once.
        print("[fxtrack] the cached peak is below this run's rate; calibrating again",
              file=sys.stderr, flush=True)
        entries = calibrate(device, precision, hardware, pythons, refresh=True, threads=threads,
                            only=only)
        best = yardstick(entries)
    metrics: dict[str, float] = {}
    tags: dict[str, str] = {}
    own = entries.get(framework) or {}
    if _rate(entries, framework):
        metrics["framework_matmul_tflops"] = _rate(entries, framework)
        if not own.get("contended") and not own.get("stopped"):
            metrics["own_matmul_share"] = achieved_tflops / (devices * own["tflops"])
    if own.get("stopped"):
        tags["calibration_stopped"] = own["stopped"]
    if sheet:
        peak_tflops, tags["peak_tflops_source"] = sheet
    elif best:
        fw, entry = best
        peak_tflops = entry["tflops"]
        tags["peak_tflops_source"] = f"{MACHINE}{fw}"
        tags["peak_calibrated"] = entry["date"]
    else:
        if own.get("contended"):  # the only rate measured here is what other work left:
            tags["peak_contended"] = "true"  # kept for the record, no MFU against it
            tags["peak_calibrated"] = own["date"] + " (contended, not cached)"
            metrics["peak_tflops"] = own["tflops"]
        return metrics, tags
    metrics["peak_tflops"] = peak_tflops
    metrics["mfu"] = achieved_tflops / (devices * peak_tflops)
    if metrics["mfu"] > 1.0:
        tags["mfu_over_1"] = "true"
    return metrics, tags
