"""One bracket search: double until a probe fails, then bisect to a resolution.

Written once for every search over a value whose probes pass below an edge and fail above it:
fit's largest batch (integer, in ``fxtrack.scenarios.fit.driver``) and serve's highest rate under
its SLO (float, in ``fxtrack.scenarios.serve``'s runner). A base module, so the worker side and the
orchestrator both import it. The callers' extras are hooks, not second loops: ``grow`` (fit's
hop guided by its line of memory growth), ``split`` (fit's point where the line meets the
budget), ``narrow`` (fit's tolerance, serve's relative resolution).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Generic, Optional, TypeVar

V = TypeVar("V", int, float)

# why a search ended
RESOLVED = "resolution"  # a passing and a failing value close enough
AT_UPPER = "upper"  # the upper bound passed: nothing above it was probed
AT_LOWER = "lower"  # the lower bound failed: nothing passed
MAX_PROBES = "max_probes"  # out of probes before the bracket closed


@dataclasses.dataclass
class Bracket(Generic[V]):
    """What a search found: the highest value that passed (None: none did), the lowest that
    failed above it (None: none did), every probe in order, and why it stopped."""

    passing: Optional[V]
    failing: Optional[V]
    probes: list[tuple[V, bool]]
    stop: str


def bracket_search(passes: Callable[[V], bool], start: V, *, upper: V, lower: V,
                   narrow: Callable[[V, V], bool], integer: bool = False,
                   max_probes: Optional[int] = None,
                   grow: Optional[Callable[[V], V]] = None,
                   split: Optional[Callable[[V, V], V]] = None) -> Bracket[V]:
    """Probe ``start`` (clamped to [lower, upper]); while probes pass, grow (default: double,
    clamped to ``upper``) until one fails or ``upper`` passed; while they fail, halve until one
    passes or ``lower`` failed; then split the bracket (default: its middle) until
    ``narrow(passing, failing)``. At most ``max_probes`` probes. ``passes`` is called once a
    value and may stop the search by raising: what it probed is the caller's to keep."""
    if not lower <= upper:
        raise ValueError(f"bracket_search: lower {lower} is above upper {upper}")
    if max_probes is not None and max_probes < 1:
        raise ValueError(f"bracket_search: max_probes must be at least 1, got {max_probes}")
    grow = grow or (lambda v: 2 * v)
    halve: Callable[[V], V] = (lambda v: v // 2) if integer else (lambda v: v / 2)
    split = split or ((lambda lo, hi: (lo + hi) // 2) if integer else (lambda lo, hi: (lo + hi) / 2))
    probes: list[tuple[V, bool]] = []
    passing: Optional[V] = None
    failing: Optional[V] = None

    def left() -> bool:
        return max_probes is None or len(probes) < max_probes

    def probe(value: V) -> bool:
        ok = bool(passes(value))
        probes.append((value, ok))
        return ok

    value = min(max(start, lower), upper)
    while left():  # the edge from the start: up while passing, down while failing
        if probe(value):
            passing = value
            if value >= upper or failing is not None:
                break
            value = min(max(grow(value), value + (1 if integer else 0)), upper)
        else:
            failing = value
            if passing is not None or value <= lower:
                break
            value = max(halve(value), lower)
    while passing is not None and failing is not None and not narrow(passing, failing) and left():
        middle = split(passing, failing)
        if not passing < middle < failing:  # nothing left between them on this grid
            break
        if probe(middle):
            passing = middle
        else:
            failing = middle
    if passing is None and failing is not None and failing <= lower:
        stop = AT_LOWER
    elif passing is not None and failing is None and passing >= upper:
        stop = AT_UPPER
    elif passing is not None and failing is not None and (
            narrow(passing, failing) or not passing < split(passing, failing) < failing):
        stop = RESOLVED
    else:
        stop = MAX_PROBES
    return Bracket(passing, failing, probes, stop)
