"""Trend charts: a metric over framework versions (or days) per framework and model, with the
95% interval of each point, so an upgrade that made a config slower shows as a step down.

Every finished run counts, not only the latest per config (the report's tables keep those): a
point is one config at one framework version, standing on its latest aggregate of repeats or
its latest single run, as ``fxtrack compare`` reads a side (fxtrack/report/samples.py).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fxtrack.config.frameworks import identity_settings  # noqa: E402
from fxtrack.report import samples  # noqa: E402
from fxtrack.report.charts import Chart, _slug  # noqa: E402

_DPI = 110
GROUP = ["scenario", "precision", "devices", "hardware"]


def points(frame: pd.DataFrame, metric: str = "throughput_samples_per_s",
           by: str = "version") -> dict[tuple, dict[str, list[tuple]]]:
    """(scenario, precision, devices, hardware) -> series label -> [(first run time, x label,
    Sample)], for series with at least two x values (one point is no trend)."""
    runs = samples.configs(frame) if len(frame) else pd.DataFrame()
    if runs.empty or f"metrics.{metric}" not in runs:
        return {}
    x = (runs["framework_version"].fillna("?") if by == "version"
         else pd.to_datetime(runs["start_time"], utc=True).dt.strftime("%Y-%m-%d"))
    runs = runs.assign(_x=x)
    identity = samples.identity_columns(frame)
    series_keys = [k for k in identity if k not in GROUP]
    out: dict[tuple, dict[str, list[tuple]]] = {}
    for key, group in runs.groupby(GROUP, sort=True):
        varying = [k for k in series_keys if k not in ("framework", *identity_settings(), "model")
                   and group[k].nunique() > 1]
        for ident, rows in group.groupby(series_keys, sort=True):
            found = []
            for label, at in rows.groupby("_x", sort=False):
                s = samples.sample(at, runs, metric)
                if s is not None:
                    found.append((at["start_time"].min(), str(label), s))
            if len({p[1] for p in found}) > 1:
                label = samples.describe(dict(zip(series_keys, ident)), varying)  # "torch vit"
                out.setdefault(key, {})[label] = sorted(found, key=lambda p: p[0])
    return out


def charts(frame: pd.DataFrame, out: Path, metric: str = "throughput_samples_per_s",
           by: str = "version") -> list[Chart]:
    """One PNG per (scenario, precision, devices, hardware) with a trend, written under ``out``:
    each point at the date its framework version was first measured, labelled with it."""
    drawn = []
    lower = samples.lower_is_better(metric)
    for (scenario, precision, devices, hardware), series in points(frame, metric, by).items():
        fig, ax = plt.subplots(figsize=(7.0, 4.2))
        for label, found in series.items():
            xs = [p[0] for p in found]
            ys = [p[2].point for p in found]
            spans = [p[2].interval() or (p[2].point, p[2].point) for p in found]
            errors = [[max(0.0, y - lo) for y, (lo, _) in zip(ys, spans)],
                      [max(0.0, hi - y) for y, (_, hi) in zip(ys, spans)]]
            ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=label)
            for x, y, p in zip(xs, ys, found):
                ax.annotate(p[1], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        title = f"Trend of {metric}: {scenario}, {precision}, x{devices}, {hardware}"
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(f"{metric} ({'lower' if lower else 'higher'} is better; bars: 95% interval)",
                      fontsize=8)
        ax.set_xlabel("first measured (points: framework version)" if by == "version" else "day")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.autofmt_xdate()
        fig.tight_layout()
        path = out / f"trend-{_slug(metric)}-{_slug(scenario)}-{_slug(precision)}-x{devices}-{_slug(hardware)}.png"
        fig.savefig(path, dpi=_DPI)
        plt.close(fig)
        drawn.append(Chart(title, path))
    return drawn
