"""PNG charts of the kept runs: throughput per scenario and precision, and scaling efficiency.

matplotlib runs on its Agg backend (set before pyplot is imported) so that a report renders on a
headless server; figures are closed after saving because a report may draw dozens.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
import pandas as pd  # noqa: E402

from fxtrack.report.select import frameworks, metric  # noqa: E402
from fxtrack.report.tables import scaling_points  # noqa: E402

_DPI = 110


@dataclasses.dataclass
class Chart:
    title: str
    path: Path


def throughput_charts(runs: pd.DataFrame, out: Path) -> list[Chart]:
    """One grouped bar chart per (scenario, precision): a bar per framework for each model."""
    charts = []
    runs = runs.assign(_thr=[metric(r, "throughput_samples_per_s") for _, r in runs.iterrows()],
                       _low=[metric(r, "throughput_ci_low") for _, r in runs.iterrows()],
                       _high=[metric(r, "throughput_ci_high") for _, r in runs.iterrows()])
    runs = runs[runs["_thr"].notna()]
    for (scenario, precision), frame in runs.groupby(["scenario", "precision"], sort=False):
        settings = frame[["devices", "hardware"]].drop_duplicates()
        # Models measured at several device counts or on several kinds of hardware get one bar
        # group per setting, labelled with it, so that no two settings share a bar.
        label = (frame["model"] if len(settings) == 1 else
                 frame["model"] + " x" + frame["devices"].astype(str) + " " + frame["hardware"])
        frame = frame.assign(_label=label)
        categories = sorted(frame["_label"].unique())
        fws = frameworks(frame)
        title = f"Throughput: {scenario}, {precision}"
        if len(settings) == 1:
            devices, hardware = settings.iloc[0]
            title += f", x{devices}, {hardware}"
        fewest = int(frame["repeats"].min()) if "repeats" in frame.columns else 1
        if fewest > 1:  # how many repeats each bar stands on, on the chart itself
            title += f" (median of {fewest}+ repeats)"
        path = out / f"throughput-{_slug(scenario)}-{_slug(precision)}.png"
        _bars(frame, categories, fws, title, path)
        charts.append(Chart(title, path))
    return charts


def _bars(frame: pd.DataFrame, categories: list[str], fws: list[str], title: str,
          path: Path) -> None:
    width = 0.8 / len(fws)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(categories) * max(1, len(fws)) / 2), 4.2))
    for i, fw in enumerate(fws):
        sub = frame[frame["framework"] == fw].set_index("_label")
        xs = [c + (i - (len(fws) - 1) / 2) * width for c in range(len(categories))]
        heights = [float(sub.loc[c, "_thr"]) if c in sub.index else 0.0 for c in categories]
        flagged = [c in sub.index and sub.loc[c, "check"] != "ok" for c in categories]
        # Error bars: the 95% interval of an aggregate of repeats (none for a single run).
        low = [h - _num(sub.loc[c, "_low"], h) if c in sub.index else 0.0
               for c, h in zip(categories, heights)]
        high = [_num(sub.loc[c, "_high"], h) - h if c in sub.index else 0.0
                for c, h in zip(categories, heights)]
        errors = [[max(0.0, v) for v in low], [max(0.0, v) for v in high]]
        bars = ax.bar(xs, heights, width, label=fw,
                      yerr=errors if any(low + high) else None, capsize=3)
        for bar, height, flag, above in zip(bars, heights, flagged, errors[1]):
            if flag:  # hatched: failed the correctness guard, not a figure to trust
                bar.set_hatch("//")
            if height:
                ax.annotate(f"{height:,.0f}" if height >= 100 else f"{height:.3g}", (bar.get_x() + bar.get_width() / 2, height + above),
                            ha="center", va="bottom", fontsize=7, xytext=(0, 2),
                            textcoords="offset points")
    ax.set_xticks(range(len(categories)), categories)
    ax.set_ylabel("samples/s (higher is better; bars: 95% interval)")
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    if (frame["check"] != "ok").any():
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//"))
        labels.append("failed the guard")
    ax.legend(handles, labels, title="framework")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def scaling_chart(runs: pd.DataFrame, out: Path) -> list[Chart]:
    """Scaling efficiency against device count, one line per framework/model, if any data."""
    points = scaling_points(runs)
    if not points:
        return []
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    counts, top = {1}, 100.0
    for (fw, model, precision, hardware), series in sorted(points.items()):
        # One device is 100% by definition: the anchor every line starts from.
        xs, ys = [1], [100.0]
        for n in sorted(set(series) - {1}):
            xs.append(n)
            ys.append(series[n][0] * 100)
        counts.update(xs)
        top = max(top, *ys)
        ax.plot(xs, ys, marker="o", label=f"{fw} {model} ({precision}, {hardware})")
    ax.axhline(100, color="grey", linestyle="--", linewidth=1, label="linear")
    ax.set_ylim(0, top * 1.08)  # from zero, so that 90% does not look like a collapse
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(counts), [str(n) for n in sorted(counts)])
    ax.set_xlabel("devices")
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_title("Scaling efficiency")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "scaling.png"
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return [Chart("Scaling efficiency", path)]


def draw(runs: pd.DataFrame, out: Path) -> list[Chart]:
    """Every chart the data allow, written under ``out``."""
    return throughput_charts(runs, out) + scaling_chart(runs, out)


def _num(value, default: float) -> float:
    return default if value is None or pd.isna(value) else float(value)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in str(text))
