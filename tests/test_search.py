"""fxtrack.search: the one bracket search fit and serve share (issue 41 item 3)."""

import pytest

from fxtrack.search import AT_LOWER, AT_UPPER, MAX_PROBES, RESOLVED, bracket_search


def below(edge, calls=None):
    def passes(value):
        if calls is not None:
            calls.append(value)
        return value <= edge
    return passes


def test_integer_doubles_then_bisects_to_the_edge():
    calls = []
    found = bracket_search(below(300, calls), 4, upper=10_000, lower=1, integer=True,
                           narrow=lambda lo, hi: hi - lo <= 1)
    assert (found.passing, found.failing, found.stop) == (300, 301, RESOLVED)
    assert calls[:8] == [4, 8, 16, 32, 64, 128, 256, 512]  # doubled until it failed
    assert all(isinstance(v, int) for v in calls)
    assert found.probes == [(v, v <= 300) for v in calls]  # every probe, in order


def test_float_stops_at_the_relative_resolution():
    found = bracket_search(below(37.3), 1.0, upper=1e6, lower=1 / 16,
                           narrow=lambda lo, hi: hi - lo <= 0.05 * lo)
    assert found.passing <= 37.3 < found.failing <= 1.05 * found.passing
    assert found.stop == RESOLVED


@pytest.mark.parametrize("integer, start, edge", [(True, 512, 5), (False, 4.0, 0.3)])
def test_a_start_above_the_edge_halves_down_then_bisects(integer, start, edge):
    calls = []
    found = bracket_search(below(edge, calls), start, upper=10_000, lower=1 if integer else 0.01,
                           integer=integer, narrow=lambda lo, hi: hi - lo <= 0.1 * lo)
    assert found.passing <= edge < found.failing
    assert calls[0] == start and calls[1] == start / 2  # halved after the first miss


def test_nothing_passes_down_to_the_lower_bound():
    calls = []
    found = bracket_search(below(0, calls), 64, upper=1024, lower=1, integer=True,
                           narrow=lambda lo, hi: hi - lo <= 1)
    assert (found.passing, found.failing, found.stop) == (None, 1, AT_LOWER)
    assert calls == [64, 32, 16, 8, 4, 2, 1]


def test_everything_passes_up_to_the_upper_bound_which_is_probed():
    calls = []
    found = bracket_search(below(10**9, calls), 3, upper=100, lower=1, integer=True,
                           narrow=lambda lo, hi: hi - lo <= 1)
    assert (found.passing, found.failing, found.stop) == (100, None, AT_UPPER)
    assert calls == [3, 6, 12, 24, 48, 96, 100]


def test_max_probes_bounds_the_search_and_says_so():
    calls = []
    found = bracket_search(below(100_000, calls), 1, upper=10**6, lower=1, integer=True,
                           max_probes=5, narrow=lambda lo, hi: hi - lo <= 1)
    assert len(calls) == 5 and found.stop == MAX_PROBES
    assert (found.passing, found.failing) == (16, None)  # a lower bound, the bracket open


def test_hooks_choose_the_next_value_and_a_raise_keeps_the_probes_so_far():
    seen = []

    def passes(value):
        seen.append(value)
        if len(seen) == 3:
            raise KeyboardInterrupt  # a stopped search: the caller keeps what it probed
        return value <= 50

    with pytest.raises(KeyboardInterrupt):
        bracket_search(passes, 10, upper=1000, lower=1, integer=True,
                       narrow=lambda lo, hi: hi - lo <= 1, grow=lambda v: v + 35)
    assert seen == [10, 45, 80]  # grown by the hook, not doubled
    found = bracket_search(below(50), 40, upper=1000, lower=1, integer=True,
                           narrow=lambda lo, hi: hi - lo <= 1, split=lambda lo, hi: hi - 1)
    assert [v for v, _ in found.probes] == [40, 80, *range(79, 49, -1)] and found.passing == 50


def test_bad_bounds_are_refused_in_one_line():
    with pytest.raises(ValueError, match="lower 10 is above upper 5"):
        bracket_search(below(3), 1, upper=5, lower=10, narrow=lambda lo, hi: True)
    with pytest.raises(ValueError, match="max_probes must be at least 1"):
        bracket_search(below(3), 1, upper=5, lower=1, max_probes=0, narrow=lambda lo, hi: True)
