"""Time marks for ``bench/job_overhead.py --itemise``: loaded by every Python process the bench
starts (this folder goes first on PYTHONPATH) and active only with FXTRACK_BENCH_MARKS set, it
appends ``<process> <mark> <epoch seconds>`` lines to that file at the points where a tiny job's
time changes hands. Bench-only: fxtrack itself carries no tracing for this.

Each wrapper is put in before fxtrack's own modules import the name it wraps, so the
``from ... import`` in them binds the wrapped one; the modules imported here early are ones the
same process imports anyway, so the whole process does the same work.
"""

import os
import sys
import time

_PATH = os.environ.get("FXTRACK_BENCH_MARKS")


def mark(name: str) -> None:
    """One line, appended in one write (several processes share the file)."""
    if _PATH:
        line = f"{_PROCESS} {name} {time.time():.6f}\n"
        fd = os.open(_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def _wrap(owner, name: str, before: str = "", after: str = "") -> None:
    inner = getattr(owner, name)

    def wrapped(*args, **kwargs):
        if before:
            mark(before)
        try:
            return inner(*args, **kwargs)
        finally:
            if after:
                mark(after)

    setattr(owner, name, wrapped)


def _orchestrator() -> None:
    import atexit

    from fxtrack.orchestrator import runner

    _wrap(runner, "run_worker", "worker_spawn", "worker_exit")
    close_gate = runner._close_gate

    def close_gate_marked(write_fd, go):
        if go:
            mark("gate_open")
        return close_gate(write_fd, go)

    runner._close_gate = close_gate_marked
    from fxtrack.orchestrator.job import Job

    _wrap(Job, "run", "job_run", "logged")
    try:
        from fxtrack.tracking.tracker import Tracker

        _wrap(Tracker, "load", "tracking_start", "tracking_done")
    except ImportError:  # a --compare-root from before tracking.Tracker (2026-12-07)
        _wrap(Job, "load_tracking", "tracking_start", "tracking_done")
    atexit.register(mark, "atexit")


def _worker() -> None:
    from fxtrack.measure import host_load, timer

    _wrap(timer, "time_steps", "steps_start", "steps_end")
    _wrap(host_load, "wait_for_idle", "probe_start", "probe_end")  # the quiet probe before
    gate = os.environ.get("FXTRACK_GATE_FD")
    if gate is not None:  # the worker opens its gate's pipe once it has built its model
        fdopen = os.fdopen

        def fdopen_marked(fd, *args, **kwargs):
            if fd == int(gate):
                mark("built")
            return fdopen(fd, *args, **kwargs)

        os.fdopen = fdopen_marked


_PROCESS = {("-m", "fxtrack"): "orchestrator", ("-m", "fxtrack.worker"): "worker"}.get(
    tuple(sys.orig_argv[1:3]), "bare")
if _PATH:
    mark("interpreter")
    if _PROCESS == "orchestrator":
        _orchestrator()
    elif _PROCESS == "worker":
        _worker()
