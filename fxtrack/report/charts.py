"""PNG charts of the kept runs: throughput per scenario and precision, scaling efficiency, and
serving's latency against throughput.

matplotlib runs on its Agg backend (set before pyplot is imported) so that a report renders on a
headless server; figures are closed after saving because a report may draw dozens.
"""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
import pandas as pd  # noqa: E402

from fxtrack import architectures  # noqa: E402
from fxtrack.report.select import by_model, frameworks, metric  # noqa: E402
from fxtrack.report.tables import scaling_points  # noqa: E402

_DPI = 110


@dataclasses.dataclass
class Chart:
    title: str
    path: Path
    caption: str = ""  # what the marks mean, under the chart in the Markdown and HTML pages


CONTENDED_NOTE = "* contended: other processes took > 10% of the cores while it ran"
# the size presets of conf/size/: what a reader must know before comparing to published figures
SIZE_WORDS = {"tiny": "tiny models (a few layers: a smoke test, not the published sizes)",
              "full": "full-size models"}



WHISKER_CAP = 1.6  # the y axis reaches this multiple of the tallest bar, no further

def colour(framework: str) -> str:
    """The framework's declared colour (``keras-jax``: Keras's), the same on every chart."""
    from fxtrack.config.frameworks import declared

    found = declared().get(str(framework).partition("-")[0].partition("[")[0])
    return found.colour if found else "grey"

def throughput_charts(runs: pd.DataFrame, out: Path) -> list[Chart]:
    """One grouped bar chart per (scenario, precision): a bar per framework for each model."""
    charts = []
    runs = runs.assign(_thr=[metric(r, "throughput_samples_per_s") for _, r in runs.iterrows()],
                       _low=[metric(r, "throughput_ci_low") for _, r in runs.iterrows()],
                       _high=[metric(r, "throughput_ci_high") for _, r in runs.iterrows()])
    runs = runs[runs["_thr"].notna()]
    for column, default in (("repeats", 1), ("contended", "false"), ("size", None)):
        if column not in runs.columns:
            runs = runs.assign(**{column: default})
    for (scenario, precision), frame in runs.groupby(["scenario", "precision"], sort=False):
        settings = frame[["devices", "hardware"]].drop_duplicates()
        # Models measured at several device counts or on several kinds of hardware get one bar
        # group per setting, labelled with it, so that no two settings share a bar.
        # the model as the dims that ran name it (identity.size_label): ViT-B/16 only at its dims
        named = frame[by_model(frame)].astype(str)
        label = (named if len(settings) == 1 else
                 named + " x" + frame["devices"].astype(str) + " " + frame["hardware"])
        sizes = _sizes(frame)
        frame = frame.assign(_label=label)
        categories = sorted(frame["_label"].unique())
        fws = frameworks(frame)
        title = f"Throughput: {scenario}, {precision}"
        if len(settings) == 1:
            devices, hardware = settings.iloc[0]
            title += f", x{devices}, {hardware}"
        if len(sizes) == 1 and sizes[0] != "other":  # every bar at its published dims, or tiny
            title += f", {sizes[0]} models"
        path = out / f"throughput-{_slug(scenario)}-{_slug(precision)}.png"
        intervals = _bars(frame, categories, fws, title, path)
        charts.append(Chart(title, path, _caption(frame, sizes, intervals)))
    return charts


def _sizes(frame: pd.DataFrame) -> list[str]:
    """``full`` for a bar group at its model's published dims, else its size preset (a run
    at size=full with model.layers=2 is not a full model); empty where no size was logged."""
    if frame["size"].isna().all():
        return []
    if "label" not in frame:
        return sorted(frame["size"].dropna().astype(str).unique())
    published = frame["label"] == frame["model"].map(architectures.display_name)
    return sorted({"full" if p else ("tiny" if s == "tiny" else "other")
                   for p, s in zip(published, frame["size"])})


def _caption(frame: pd.DataFrame, sizes: list[str], intervals: bool) -> str:
    """The chart's key in words: what a bar is, what its whiskers are, the marks, the size."""
    words = ["Bars: samples/s, higher is better; n = the repeats each bar stands on"]
    words.append("whiskers: the 95% interval of the repeats' median" if intervals else
                 "no intervals (every bar is a single run: use repeats=3 for them)")
    if _contended(frame).any():
        words.append(CONTENDED_NOTE)
    if (frame["check"] != "ok").any():
        words.append("hatched: failed the correctness guard")
    if len(sizes) == 1:
        words.append(SIZE_WORDS.get(sizes[0], "models at the dims their labels name"))
    elif sizes:
        words.append("model sizes as labelled")
    else:
        words.append("model size not logged")
    return "; ".join(words) + "."


def _contended(frame: pd.DataFrame) -> pd.Series:
    return frame["contended"].astype(str).str.lower() == "true"


def _bars(frame: pd.DataFrame, categories: list[str], fws: list[str], title: str,
          path: Path) -> bool:
    """Draw and save the chart; returns whether any bar has an interval."""
    width = 0.8 / len(fws)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(categories) * max(1, len(fws)) / 2), 4.6))
    any_interval = False
    # a whisker past this is drawn to it and marked with its top: one wide interval never
    # flattens the other bars to the axis
    cap = WHISKER_CAP * max([float(v) for v in frame["_thr"] if v == v] or [1.0])
    clipped_any = False
    for i, fw in enumerate(fws):
        sub = frame[frame["framework"] == fw].set_index("_label")
        xs = [c + (i - (len(fws) - 1) / 2) * width for c in range(len(categories))]
        heights = [float(sub.loc[c, "_thr"]) if c in sub.index else 0.0 for c in categories]
        flagged = [c in sub.index and sub.loc[c, "check"] != "ok" for c in categories]
        busy = [c in sub.index and str(sub.loc[c, "contended"]).lower() == "true"
                for c in categories]
        counts = [int(sub.loc[c, "repeats"]) if c in sub.index else 0 for c in categories]
        # Whiskers: the 95% interval of an aggregate of repeats; a single run has none.
        low = [h - _num(sub.loc[c, "_low"], h) if c in sub.index and n > 1 else 0.0
               for c, h, n in zip(categories, heights, counts)]
        high = [_num(sub.loc[c, "_high"], h) - h if c in sub.index and n > 1 else 0.0
                for c, h, n in zip(categories, heights, counts)]
        tops = [h + max(0.0, v) for h, v in zip(heights, high)]
        errors = [[max(0.0, v) for v in low],
                  [max(0.0, min(v, cap - h)) for v, h in zip(high, heights)]]
        any_interval = any_interval or any(low + high)
        bars = ax.bar(xs, heights, width, label=fw, color=colour(fw),
                      yerr=errors if any(low + high) else None, capsize=3)
        for bar, height, flag, above, n, contended, top in zip(bars, heights, flagged, errors[1],
                                                               counts, busy, tops):
            if flag:  # hatched: failed the correctness guard, not a figure to trust
                bar.set_hatch("//")
            if height:
                value = f"{height:,.0f}" if height >= 100 else f"{height:.3g}"
                clipped = top > cap
                clipped_any = clipped_any or clipped
                mark = f"\n\u25b2 to {top:,.3g}" if clipped else ""
                ax.annotate(f"{value}{'*' if contended else ''}\nn={n}{mark}",
                            (bar.get_x() + bar.get_width() / 2, height + above),
                            ha="center", va="bottom", fontsize=7, xytext=(0, 2),
                            textcoords="offset points")
    # long model labels wrap, so neighbouring labels never overlap
    ax.set_xticks(range(len(categories)), ["\n".join(textwrap.wrap(c, 18)) for c in categories],
                  fontsize=8)
    ax.set_ylabel("samples/s (higher is better)")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.12)  # room for the two-line labels above the bars
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    if clipped_any:
        handles.append(Patch(facecolor="none", edgecolor="none"))
        labels.append("\u25b2 interval drawn to the cap, its top said")
    if any_interval:
        handles.append(Line2D([], [], color="black", marker="|", linestyle="none",
                              markersize=10))
        labels.append("95% interval of the median")
    if (frame["check"] != "ok").any():
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//"))
        labels.append("failed the guard")
    if _contended(frame).any():
        handles.append(Patch(facecolor="none", edgecolor="none"))
        labels.append("* contended (busy cores)")
    ax.legend(handles, labels, title="framework", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return any_interval


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


def latency_throughput_chart(lines: dict[str, list[tuple[float, float, bool]]], title: str,
                             ylabel: str, path: Path, caption: str = "") -> Chart:
    """Serving: one line per framework through its windows, p99 latency against the achieved
    throughput; a window that met its SLOs (and kept up) filled, one that failed hollow."""
    fig, ax = plt.subplots(figsize=(6.5, 4.4))
    seen: dict[str, int] = {}
    for label, points in sorted(lines.items()):
        points = sorted(points)
        fw = label.split(" ")[0]
        colour = globals()["colour"](fw)  # a framework's second line (a policy) is dashed
        style = ("-", "--", ":")[min(2, seen.setdefault(fw, 0))]
        seen[fw] += 1
        ax.plot([p[0] for p in points], [p[1] for p in points], color=colour, label=label,
                linestyle=style)
        for x, y, ok in points:
            ax.plot([x], [y], "o", color=colour, markerfacecolor=colour if ok else "white")
    ax.set_xlabel("achieved throughput (requests/s)")
    ax.set_ylabel(ylabel)
    ax.set_yscale("log")  # past saturation the queue's wait grows by orders of magnitude
    ax.set_title(title)
    ax.legend(title="framework", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return Chart(title, path, caption)


def draw(runs: pd.DataFrame, out: Path) -> list[Chart]:
    """Every chart the data allow, written under ``out``."""
    return throughput_charts(runs, out) + scaling_chart(runs, out)


def _num(value, default: float) -> float:
    return default if value is None or pd.isna(value) else float(value)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in str(text))
