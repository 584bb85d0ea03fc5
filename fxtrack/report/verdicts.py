"""Verdicts: each framework's throughput as a ratio to the best, with its 95% interval, in words.

For every (scenario, precision, devices, hardware) group and model, the framework with the highest
median throughput is the reference. Another framework's ratio is median / best median; its
interval is Welch's t interval for the ratio of geometric means from each aggregate's log
throughput (fxtrack/stats.py), so a ratio whose interval holds 1 reads "no clear difference"
(two-sided Welch test at 5%). A single run has no interval: its ratio is shown, its verdict says
so. ``--min-repeats N`` refuses to rank a row where any framework has fewer than N repeats.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import pandas as pd

from fxtrack import stats
from fxtrack.report.select import by_model, frameworks, metric
from fxtrack.report.tables import CONTENDED, Table, group_title, groups

NOISY_REL_CI = 0.10  # an interval wider than 10% of the median: a figure to re-measure
CONTENDED_MARK, NOISY_MARK = CONTENDED, "~"


@dataclasses.dataclass
class Ratio:
    framework: str
    ratio: float  # median throughput / the best median (1.0 for the best)
    interval: Optional[tuple[float, float]]  # None: a side has fewer than two repeats
    repeats: int
    marks: str  # CONTENDED_MARK / NOISY_MARK

    @property
    def clear(self) -> bool:
        """The interval excludes 1: a difference the repeats support."""
        return self.interval is not None and not (self.interval[0] <= 1.0 <= self.interval[1])

    def cell(self) -> str:
        text = f"{self.ratio:.2f}x"
        if self.interval is not None and self.ratio != 1.0:
            text += f" [{self.interval[0]:.2f}, {self.interval[1]:.2f}]"
        return text + (f" {self.marks}" if self.marks else "")


def _log_stats(row: pd.Series) -> Optional[tuple[float, float, int]]:
    mean, sd = metric(row, "throughput_log_mean"), metric(row, "throughput_log_sd")
    n = int(row.get("repeats") or 1)
    return None if mean is None or sd is None or n < 2 else (mean, sd, n)


def _marks(row: pd.Series) -> str:
    marks = CONTENDED_MARK if str(row.get("contended")) == "true" else ""
    rel = metric(row, "throughput_rel_ci")
    noisy = (rel is not None and rel > NOISY_REL_CI) or str(row.get("noisy")) == "true"
    return marks + (NOISY_MARK if noisy else "")


def ratios(peers: pd.DataFrame) -> list[Ratio]:
    """Each framework's Ratio to the best of ``peers`` (one model in one group). Runs that failed
    the correctness guard do not set the bar (unless none passed)."""
    rows = [(r, metric(r, "throughput_samples_per_s")) for _, r in peers.iterrows()]
    rows = [(r, v) for r, v in rows if v]
    if not rows:
        return []
    passed = [(r, v) for r, v in rows if r["check"] == "ok"] or rows
    best_row, best = max(passed, key=lambda rv: rv[1])
    best_log = _log_stats(best_row)
    out = []
    for r, v in rows:
        mine = _log_stats(r)
        if r is best_row:
            interval = (1.0, 1.0) if best_log else None
        else:
            interval = stats.ratio_interval(mine, best_log) if mine and best_log else None
        out.append(Ratio(r["framework"], v / best, interval, int(r.get("repeats") or 1), _marks(r)))
    return out


def verdict(found: list[Ratio], min_repeats: int = 1) -> str:
    """The row's verdict in plain words."""
    if len(found) < 2:
        return "one framework: nothing to compare"
    fewest = min(r.repeats for r in found)
    if fewest < min_repeats:
        return f"not ranked: {fewest} repeat(s) < --min-repeats {min_repeats}"
    best = next(r for r in found if r.ratio == 1.0)
    others = [r for r in found if r is not best]
    if any(r.interval is None for r in others):
        return f"{best.framework} fastest; single runs, no interval (use repeats=3)"
    tied = [r.framework for r in others if not r.clear]
    if len(tied) == len(others):
        return "no clear difference"
    if tied:
        return f"{best.framework} fastest; no clear difference with {', '.join(tied)}"
    return f"{best.framework} fastest"


def table(runs: pd.DataFrame, min_repeats: int = 1) -> list[Table]:
    """One verdict table per group: rows are models, cells each framework's ratio to the best."""
    tables = []
    for key, group in groups(runs):
        fws = frameworks(group)
        rows = []
        for model, peers in group.groupby(by_model(group), sort=True):
            found = ratios(peers)
            if not found:
                continue
            n = min(r.repeats for r in found)
            ranked = n >= min_repeats
            by_fw = {r.framework: r.cell() if ranked else f"{r.repeats} rep." for r in found}
            words = verdict(found, min_repeats)
            if any(CONTENDED_MARK in r.marks for r in found):
                words += " (contended: re-measure on a quiet machine)"
            rows.append([model, *[by_fw.get(fw, "-") for fw in fws], str(n), words])
        if rows:
            tables.append(Table(f"Verdict (throughput vs the best): {group_title(key)}",
                                ["model", *fws, "repeats", "verdict"], rows, NOTES))
    return tables


NOTES = [
    "ratio = median throughput / the best framework's median; [low, high] = 95% Welch t interval "
    "of the ratio (log throughput over the repeats); an interval holding 1.00 = no clear "
    "difference",
    f"{CONTENDED_MARK} = contended: other processes took > 10% of the cores in a timed window; "
    f"{NOISY_MARK} = noisy: the throughput interval is wider than "
    f"{NOISY_REL_CI:.0%} of the median (or step times vary > 10%)",
    "repeats = the fewest repeats behind any figure in the row",
]
