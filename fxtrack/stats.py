"""Intervals for repeated measurements; the t distribution is scipy's (scipy.stats.t).

Which interval, and why: with the 3-5 repeats a benchmark affords, a bootstrap has too few
distinct resamples to reach its nominal coverage (for n = 3 its percentile interval is about
[min, max], which covers the median only 75% of the time), and an order-statistic interval for the
median needs n >= 6 for 95%. So fxtrack states a **Student-t 95% interval** (n - 1 degrees of
freedom) of the mean *log* of a rate (throughput, step time), exponentiated, so that it stays
positive however few the repeats (log_t_interval), and reports the **median** as the headline; comparisons between two frameworks
use **Welch's t interval on log throughput**, i.e. an interval for the ratio of their geometric
means, whose inclusion of 1 is a two-sided Welch test at 5%: "no clear difference".
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Optional, Sequence

LEVEL = 0.95


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def mean_sd(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and the sample standard deviation (n - 1 in the denominator; 0 for one value).
    Plain arithmetic, not statistics.stdev: that raises on a nan or inf, which must propagate."""
    n = len(xs)
    m = sum(xs) / n
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0)


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` (possibly fractional) degrees of freedom."""
    # Imported on use: scipy.stats takes ~0.5 s to load, and only an aggregate or a verdict needs it.
    from scipy.stats import t as student_t

    return float(student_t.cdf(t, df))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (``df`` may be fractional: Welch-Satterthwaite)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    from scipy.stats import t as student_t

    return float(student_t.ppf(p, df))


@dataclasses.dataclass
class Interval:
    """A point estimate with a two-sided ``LEVEL`` interval; low == high == point for one sample."""

    point: float
    low: float
    high: float
    n: int

    @property
    def rel_width(self) -> float:
        """Interval width / point (``throughput_rel_ci``)."""
        return (self.high - self.low) / self.point if self.point else math.inf


def t_interval(xs: Sequence[float], level: float = LEVEL) -> Interval:
    """Median of ``xs`` with the Student-t interval of their mean: mean +- t(n-1) s / sqrt(n)."""
    n = len(xs)
    if n == 0:
        raise ValueError("an interval needs at least one value")
    m, sd = mean_sd(xs)
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n) if n > 1 else 0.0
    return Interval(median(xs), m - half, m + half, n)


def log_t_interval(xs: Sequence[float], level: float = LEVEL) -> Interval:
    """Median of positive ``xs`` with the Student-t interval of their mean log, exponentiated:
    an interval for the geometric mean that, unlike mean +- t s / sqrt(n), stays positive for
    a rate (throughput, step time) with few repeats and a large t quantile."""
    ci = t_interval([math.log(x) for x in xs], level)
    return Interval(median(xs), math.exp(ci.low), math.exp(ci.high), ci.n)


def ratio_interval(log_a: tuple[float, float, int], log_b: tuple[float, float, int],
                   level: float = LEVEL) -> Optional[tuple[float, float]]:
    """Interval for (geometric mean of a) / (geometric mean of b) from each side's
    (mean, sample sd, n) of log values, by Welch's t; None when either side has one value."""
    (ma, sa, na), (mb, sb, nb) = log_a, log_b
    if na < 2 or nb < 2:
        return None
    va, vb = sa * sa / na, sb * sb / nb
    diff = ma - mb
    if va + vb == 0.0:
        return math.exp(diff), math.exp(diff)
    df = (va + vb) ** 2 / (va * va / (na - 1) + vb * vb / (nb - 1))  # Welch-Satterthwaite
    half = t_quantile(0.5 + level / 2, df) * math.sqrt(va + vb)
    return math.exp(diff - half), math.exp(diff + half)


def log_summary(xs: Sequence[float]) -> tuple[float, float, int]:
    """(mean, sample sd, n) of log(xs): what ratio_interval needs, and what an aggregate run logs."""
    m, sd = mean_sd([math.log(x) for x in xs])
    return m, sd, len(xs)
