"""The trade-offs drawn: a Pareto chart per model, one point per framework and mode.

Training: throughput (higher is better) against peak memory per sample (lower is better);
serving: p99 latency (lower) against throughput (higher). ``frontier`` is the pure part: which
points no other point beats on both axes. A framework none of whose points is on the frontier
is named under the chart.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from fxtrack import architectures, scenarios
from fxtrack.report import identity, samples
from fxtrack.report.answer import _framework, _mode, fw_words

# (scenario, x metrics, x label, x lower-is-better, y metrics, y label, y lower-is-better);
# the first metric of each tuple a run logged is read (the serve names are scenario=serve's).
AXES = (
    ("train", ("peak_mem_device_mib", "peak_rss_mib"), "peak memory per sample (MiB, lower is better)",
     True, ("throughput_samples_per_s",), "samples/s (higher is better)", False),
    ("serve", ("goodput_rps", "max_rate_under_slo_rps"), "throughput (requests/s, higher is better)",
     False, ("serve_e2e_ms_p99", "serve_ttft_ms_p99", "serve_tpot_ms_p99"), "p99 latency (ms, lower is better)", True),
)


@dataclasses.dataclass
class Point:
    label: str  # "torch (compile=auto)"
    framework: str
    x: float
    y: float
    y_interval: Optional[tuple[float, float]]
    run_id: str


def frontier(points: Sequence[tuple[float, float]], x_lower: bool, y_lower: bool) -> list[bool]:
    """For each (x, y), whether it is non-dominated: no other point is at least as good on both
    axes and strictly better on one."""
    def better_eq(a: float, b: float, lower: bool) -> bool:
        return a <= b if lower else a >= b

    out = []
    for i, (x, y) in enumerate(points):
        dominated = any(
            j != i and better_eq(ox, x, x_lower) and better_eq(oy, y, y_lower) and (ox, oy) != (x, y)
            for j, (ox, oy) in enumerate(points))
        out.append(not dominated)
    return out


def points(frame: pd.DataFrame, model: str, axes: tuple, label: Optional[str] = None) -> list[Point]:
    """One point per config of ``model`` (at the dims ``label`` names, if given) in the axes'
    scenario with both figures."""
    scenario, xs, _, _, ys, _, _ = axes
    configs = samples.configs(frame)
    runs = configs[(configs["model"] == model) & (configs["scenario"] == scenario)]
    if label is not None:  # a tiny run and the full model never share a chart
        runs = runs[runs["label"] == label]
    x_key = next((m for m in xs if f"metrics.{m}" in runs and runs[f"metrics.{m}"].notna().any()), None)
    y_key = next((m for m in ys if f"metrics.{m}" in runs and runs[f"metrics.{m}"].notna().any()), None)
    if runs.empty or x_key is None or y_key is None:
        return []
    ident = [c for c in samples.identity_columns(configs) if c in runs.columns]
    # two configs of one framework (a serve rate and a rate search): each point says which
    apart = identity.apart(runs, ["model"])
    out = []
    for _, group in runs.groupby(ident, sort=False, dropna=False):
        x, y = samples.sample(group, configs, x_key), samples.sample(group, configs, y_key)
        if x is None or y is None:
            continue
        config = group.iloc[-1]
        x_value = x.point
        if scenarios.get(scenario).trains:  # memory per sample: the batch's peak over its samples
            batch = int(config["batch_size"]) if str(config["batch_size"]).isdigit() else 1
            x_value /= max(batch, 1)
        fw = _framework(config)
        extra = apart[group.index[-1]]
        out.append(Point(f"{fw_words(fw)} ({_mode(config)}, batch {config['batch_size']}"
                         + (f", {extra})" if extra else ")"), fw,
                         x_value, y.point, y.interval(), y.run_ids[-1]))
    return out


@dataclasses.dataclass
class Drawn:
    title: str
    path: Path
    caption: str
    never: list[str]  # frameworks never on the frontier
    points: list[Point]
    on_frontier: list[bool]


def charts(frame: pd.DataFrame, out: Path) -> list[Drawn]:
    """One Pareto chart per model and axes pair with at least one point, saved under ``out``."""
    from fxtrack.report.charts import _slug  # the file names every chart uses

    configs = samples.configs(frame)
    drawn = []
    pairs = sorted(set(zip(configs["model"], configs["label"]))) if not configs.empty else []
    for model, label in pairs:
        for axes in AXES:
            found = points(frame, model, axes, label)
            if not found:
                continue
            marks = frontier([(p.x, p.y) for p in found], axes[3], axes[6])
            never = sorted({p.framework for p in found} - {p.framework for p, m in zip(found, marks) if m})
            # a model name may hold '/': the slug every chart's file name uses
            name = _slug(model if label == architectures.display_name(model) else label)
            path = out / f"pareto-{axes[0]}-{name}.png"
            title = f"Trade-offs: {label}, {axes[0]}"
            _draw(found, marks, axes, title, path)
            caption = ("Filled: on the frontier (no other point is better on both axes); "
                       "whiskers: 95% interval of the vertical figure where it has repeats")
            if never:
                caption += "; never on the frontier: " + ", ".join(fw_words(f) for f in never)
            drawn.append(Drawn(title, path, caption + ".", never, found, marks))
    return drawn


def _draw(found: list[Point], marks: list[bool], axes: tuple, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.4))
    from fxtrack.report.charts import WHISKER_CAP, colour as colour_of

    # a whisker past the cap is drawn to it, its top said: one wide interval never flattens
    # the points to the axis
    cap = WHISKER_CAP * max(p.y for p in found)
    # labels of nearby points stacked apart, so that none is written over another
    placed: list[tuple[float, float, int]] = []
    span_x = (max(p.x for p in found) - min(p.x for p in found)) or 1.0
    span_y = (max(p.y for p in found) - min(p.y for p in found)) or 1.0
    for p, on in zip(found, marks):
        colour = colour_of(p.framework)
        err, top = None, None
        if p.y_interval:
            top = p.y_interval[1]
            err = [[max(0.0, p.y - p.y_interval[0])], [max(0.0, min(top, cap) - p.y)]]
        ax.errorbar([p.x], [p.y], yerr=err, fmt="o", color=colour, capsize=3,
                    markerfacecolor=colour if on else "white", markersize=8)
        near = sum(abs(p.x - x) < 0.15 * span_x and abs(p.y - y) < 0.08 * span_y
                   for x, y, _ in placed)
        placed.append((p.x, p.y, near))
        label = p.label + (f" (\u25b2 interval to {top:,.3g})" if top and top > cap else "")
        ax.annotate(label, (p.x, p.y), fontsize=7, xytext=(5, 4 - 10 * near),
                    textcoords="offset points")
    front = sorted((p.x, p.y) for p, on in zip(found, marks) if on)
    if len(front) > 1:
        ax.plot(*zip(*front), color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel(axes[2])
    ax.set_ylabel(axes[5])
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
