"""The peak-FLOP/s probe's sizing, shared by every framework's ``calibration`` capability: the
framework supplies a square matmul of a given size, this module picks the size and times it.

The size grows from ``START_N`` (at most doubling) until one product takes about ``TARGET_S``,
so a slow device (bf16 emulated on a CPU without native support) gets a small matmul and a fast
one a large one; at ``max_n`` a GPU repeats the product instead. The best of ``TRIALS`` timings
at the chosen size counts. The orchestrator's calibration gives each probe a share of its time
budget as a deadline (``DEADLINE_ENV``, seconds since the epoch): the growth stops early rather
than overrun it, and ``OutOfTime`` says there was not even time for the smallest size.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Callable, Optional

TARGET_S = 0.5  # one timing's length: long against timer and dispatch noise, short for a budget
START_N = 256
STEP = 128  # sizes stay multiples of this (kernels' tile sizes divide it)
MAX_N = 8192  # three fp32 matrices: 0.8 GB; past this a device repeats the product instead
TRIALS = 3
DEADLINE_ENV = "FXTRACK_PROBE_DEADLINE"

# ``make(n)`` -> ``run(reps)``: ``reps`` products of two prepared n x n matrices, returning only
# once the device has finished them (the framework's own sync).
Matmul = Callable[[int], Callable[[int], None]]


class OutOfTime(RuntimeError):
    """The deadline left no time for even the smallest timing."""


@dataclasses.dataclass
class Probe:
    n: int
    reps: int
    best_s: float  # the fastest of the timings at (n, reps)
    trials: int  # timings taken at (n, reps)

    @property
    def tflops(self) -> float:
        return 2 * self.n**3 * self.reps / self.best_s / 1e12


def seconds_left(clock: Callable[[], float] = time.time) -> Optional[float]:
    """Seconds until this process's probe deadline (``DEADLINE_ENV``); None: no deadline."""
    deadline = os.environ.get(DEADLINE_ENV)
    return None if not deadline else float(deadline) - clock()


def probe(make: Matmul, max_n: int = MAX_N, target_s: float = TARGET_S,
          budget_s: Optional[float] = None,
          clock: Callable[[], float] = time.perf_counter) -> Probe:
    """Size the matmul to ``target_s`` and take the best of ``TRIALS`` timings there, within
    ``budget_s`` seconds (None: the process's deadline, ``seconds_left``; no deadline: no limit).
    Every size is run once untimed first: compilation for a new shape, kernel selection."""
    budget_s = seconds_left() if budget_s is None else budget_s
    start = clock()

    def left() -> float:
        return math.inf if budget_s is None else budget_s - (clock() - start)

    def timed(run: Callable[[int], None], reps: int) -> float:
        t0 = clock()
        run(reps)
        return clock() - t0

    if left() <= 0:
        raise OutOfTime("no time left for the matmul probe")
    n, reps = START_N, 1
    run = make(n)
    run(1)
    t = timed(run, 1)
    while t < target_s / 2:  # within 2x of the target is near enough: the rate is stable there
        # Time grows as n^3: the step that should reach the target, at most a doubling.
        grow = min(2.0, (target_s / max(t, 1e-9)) ** (1 / 3))
        nxt = min(max_n, max(n + STEP, int(round(n * grow / STEP)) * STEP))
        if nxt <= n:  # at max_n: repeat the product instead of growing it
            more = max(2, math.ceil(target_s / max(t, 1e-9)))
            if TRIALS * t * more <= left():
                reps, t = more, timed(run, more)
            break
        expected = t * (nxt / n) ** 3
        if 2 * expected > left():  # its warm-up and one timing would not fit
            break
        n, run = nxt, make(nxt)
        run(1)
        t = timed(run, 1)
    best, trials = t, 1
    while trials < TRIALS and best <= left():
        best = min(best, timed(run, reps))
        trials += 1
    return Probe(n, reps, best, trials)
