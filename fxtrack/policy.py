"""The framework-neutral fairness rules, in one place: which ``framework.compile`` requests
exist, how many CPU threads a run uses and on which cores. Imports no framework: the worker
calls it before (and after) importing its own. What ``framework.compile=auto`` means for each
framework is that framework's declaration (``fxtrack/frameworks/<name>/__init__.py``).

Every rule is either a documented best practice or a measured choice; a measured choice says so,
with the figure and the command that gave it (docs/measurements.md).
"""

from __future__ import annotations

import os
from typing import Optional

# framework.compile; Framework.resolve_compile. auto: the framework's declared row for the device
# and model family; true / false: as asked; tune: the fastest of the modes the framework declares,
# timed by the worker on this run's model (fxtrack/scenarios/tune.py).
COMPILE_REQUESTS = ("auto", "true", "false", "tune")


def allowed_cpus() -> list[int]:
    """The CPU ids this process may run on: its affinity mask, not the machine's core count (a
    container or ``taskset`` gives fewer); every CPU where there are no masks (macOS)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpu_threads(requested: Optional[int]) -> int:
    """``hardware.cpu_threads``, or (None) the cores this process may run on."""
    return int(requested) if requested else len(allowed_cpus())


def threads_per_process(threads: int) -> int:
    """A process's share of ``threads``: torchrun starts one process per device
    (LOCAL_WORLD_SIZE of them on this node), which together use the cores one JAX or TF process
    uses for all its devices; torchrun's own default (OMP_NUM_THREADS=1) would leave cores idle."""
    return max(1, threads // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def thread_environment(threads: int) -> dict[str, str]:
    """Environment variables that size every framework's CPU thread pools to ``threads``; set
    before the framework is imported (its pools are created at import / first use).

    OpenMP (torch's intra-op pool, oneDNN) and MKL read OMP/MKL_NUM_THREADS; TensorFlow reads
    TF_NUM_INTRAOP/INTEROP_THREADS; XLA:CPU (JAX, and TF's XLA) sizes its Eigen pool from the
    process's affinity (the XLA flags a framework needs are its declaration's
    ``prepare_environment``, e.g. JAX's at one thread)."""
    n = str(threads)
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n,
            "TF_NUM_INTRAOP_THREADS": n, "TF_NUM_INTEROP_THREADS": n}
