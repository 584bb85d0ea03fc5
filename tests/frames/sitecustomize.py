"""Counts fxtrack's frames on the run path (issue 59: at most 10 from the command to the step),
in every Python process a test starts with this folder on PYTHONPATH and FXTRACK_FRAMES_OUT set.

When fxtrack imports the one timer (``fxtrack.measure.timer``) or the worker's launcher
(``fxtrack.orchestrator.runner``), their ``time_steps`` and ``run_worker`` are wrapped before any
module binds them; the first call of each appends ``<where> <count> <frames>`` to the file:
the orchestrator's fxtrack frames down to run_worker, the worker's down to its step. Wrapping
costs nothing per call (no profiler), so the run's own figures stand.
"""

import functools
import importlib.abc
import importlib.machinery
import os
import sys

_OUT = os.environ.get("FXTRACK_FRAMES_OUT")
_PACKAGE = os.sep + "fxtrack" + os.sep
_HERE = os.path.dirname(os.path.abspath(__file__))


def _frames(frame) -> list[str]:
    """fxtrack's frames from ``frame`` up, outermost first (this file's own left out)."""
    out = []
    while frame is not None:
        path = frame.f_code.co_filename
        if _PACKAGE in path and not path.startswith(_HERE):
            out.append(f"{path.rsplit(_PACKAGE, 1)[1]}:{frame.f_code.co_name}")
        frame = frame.f_back
    return out[::-1]


def _write(where: str, frames: list[str]) -> None:
    with open(_OUT, "a", encoding="utf-8") as out:
        out.write(f"{where} {len(frames)} {' '.join(frames)}\n")


def _time_steps(inner):
    @functools.wraps(inner)
    def time_steps(step, *args, **kwargs):
        seen = []

        def first(*a, **k):  # the step's own frame counts once: it is fxtrack's, one below
            if not seen:
                seen.append(True)
                owner = getattr(step, "__func__", step).__code__.co_filename
                step_frame = [f"{owner.rsplit(_PACKAGE, 1)[-1]}:{step.__name__}"] \
                    if _PACKAGE in owner else []
                _write("worker", _frames(sys._getframe(1)) + step_frame)
            return step(*a, **k)

        return inner(first, *args, **kwargs)
    return time_steps


def _run_worker(inner):
    done = []

    @functools.wraps(inner)
    def run_worker(*args, **kwargs):
        if not done:
            done.append(True)
            own = "orchestrator/runner.py:run_worker"
            _write("orchestrator", _frames(sys._getframe(1)) + [own])
        return inner(*args, **kwargs)
    return run_worker


_WRAP = {"fxtrack.measure.timer": ("time_steps", _time_steps),
         "fxtrack.orchestrator.runner": ("run_worker", _run_worker)}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in _WRAP:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        execute = spec.loader.exec_module
        attribute, wrap = _WRAP[name]

        def exec_module(module):
            execute(module)
            setattr(module, attribute, wrap(getattr(module, attribute)))

        spec.loader.exec_module = exec_module
        return spec


if _OUT:
    sys.meta_path.insert(0, _Finder())
