"""The report's time-to-quality section (scenario=converge), by MLPerf Training's rules: each
framework's runs of one model, data and target (``repeats=N`` seeds), a verdict only from five
runs or more, the fastest and the slowest dropped, a missed target counted as slower than any
that reached it (and shown), the mean of the rest with its 95% interval, and each framework's
ratio to the fastest with its Welch interval (fxtrack/stats.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

from fxtrack import stats
from fxtrack.report.tables import Section, Table, fmt
from fxtrack.scenarios import of_section

MIN_RUNS = 5  # MLPerf Training's fewest runs for a result (its benchmarks ask 5 to 10)
GROUP = ["tags.fxtrack.model", "params.data.name", "params.scenario.target",
         "tags.fxtrack.precision", "tags.fxtrack.hardware"]
INTRO = ("Training time to the held-out target (time_to_target_s: the steps' time, evaluation "
         "and compilation excluded). MLPerf Training's rules: at least 5 runs (repeats=5), the "
         "fastest and the slowest dropped, a run that missed the target counts as the slowest "
         "and a missed run among those kept leaves no figure; the mean of the rest with its 95% "
         "interval, and the ratio to the fastest framework with its interval.")


def middle(times: list[Optional[float]]) -> tuple[Optional[list[float]], str]:
    """MLPerf's kept runs of ``times`` (None: missed the target): the fastest and slowest
    dropped; (their times, "") or (None, why there is no figure)."""
    if len(times) < MIN_RUNS:
        return None, f"{len(times)} run(s): needs repeats={MIN_RUNS}"
    ranked = sorted(times, key=lambda t: math.inf if t is None else t)[1:-1]
    missed = sum(t is None for t in ranked)
    if missed:
        return None, f"{missed} of the kept runs missed the target"
    return [float(t) for t in ranked], ""


def runs_of(frame: pd.DataFrame) -> pd.DataFrame:
    """Every single converge run (not an aggregate) that finished."""
    if frame.empty or "tags.fxtrack.scenario" not in frame or "metrics.reached_target" not in frame:
        return frame.iloc[0:0]
    kind = frame.get("tags.fxtrack.kind", pd.Series([None] * len(frame), index=frame.index))
    found = frame[frame["tags.fxtrack.scenario"].isin(of_section(__name__))
                  & frame["metrics.reached_target"].notna()
                  & (kind != "aggregate")].copy()  # a repeats=N aggregate holds medians
    for column in GROUP:
        if column not in found:
            found[column] = None
    return found


def section(runs: pd.DataFrame, frame: pd.DataFrame) -> Optional[Section]:
    found = runs_of(frame)
    if found.empty:
        return None
    tables = []
    for key, group in found.groupby(GROUP, dropna=False):
        model, data, target, precision, hardware = key
        kept = {}
        for framework, own in group.groupby("tags.fxtrack.framework"):
            times = [None if r["metrics.reached_target"] != 1.0 else r["metrics.time_to_target_s"]
                     for _, r in own.iterrows()]
            kept[framework] = (own, times, *middle(times))
        means = {fw: sum(k[2]) / len(k[2]) for fw, k in kept.items() if k[2]}
        best = min(means, key=means.get) if means else None
        rows = []
        for framework, (own, times, middle_times, why) in sorted(kept.items()):
            reached = sum(t is not None for t in times)
            interval = ratio = "-"
            if middle_times:
                ci = stats.log_t_interval(middle_times)
                interval = f"[{ci.low:.3g}, {ci.high:.3g}]"
                if best is not None and framework != best:
                    r = stats.ratio_interval(stats.log_summary(middle_times),
                                             stats.log_summary(kept[best][2]))
                    ratio = (f"{means[framework] / means[best]:.2f}x"
                             + ("" if r is None else f" [{r[0]:.2f}, {r[1]:.2f}]"))
                elif framework == best:
                    ratio = "fastest"
            finals = [v for c in own.columns if c.startswith("metrics.final_eval_")
                      and not c.endswith("_vs_fp32") for v in own[c].dropna()]
            tags = sorted(set(own.get("tags.fxtrack.trajectory", pd.Series(dtype=object))
                              .dropna().astype(str)))
            rows.append([framework, str(len(times)), str(reached),
                         "-" if framework not in means else f"{means[framework]:.3g}", interval, ratio or "-",
                         fmt(stats.median(finals), 3) if finals else "-",
                         ", ".join(tags) or "-", why or "-"])
        title = (f"Time to quality: {model} on data={data}, target {target} "
                 f"({precision}, {hardware})")
        tables.append(Table(title, ["framework", "runs", "reached", "time to target s",
                                    "95% interval", "ratio to fastest [95%]",
                                    "final metric (median)", "trajectory", "no figure because"],
                            rows))
    return Section("Time to quality", tables, INTRO)


METRICS = ("accuracy", "loss", "bits_per_byte")


def charts(frame: pd.DataFrame, out: Path,
           histories: Callable[[list[str], list[str]], dict]) -> list:
    """One chart per model, data, target, precision and hardware: each framework's held-out
    metric against its training seconds (``eval_train_s``: evaluation and compilation left
    out), every run a line, the target dashed. ``histories``: (run ids, keys) -> run id -> key
    -> (step, value) points (tracking.reader.metric_histories)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fxtrack.report.charts import Chart

    found = runs_of(frame)
    if found.empty:
        return []
    keys = ["eval_train_s", *(f"eval_{m}" for m in METRICS)]
    points = histories(list(found["run_id"]), keys)
    drawn = []
    for key, group in found.groupby(GROUP, dropna=False):
        model, data, target, precision, hardware = key
        fig, ax = plt.subplots(figsize=(6.5, 4.4))
        colours: dict = {}
        metric = None
        for _, r in group.sort_values("tags.fxtrack.framework").iterrows():
            own = points.get(r["run_id"], {})
            metric = next((m for m in METRICS if f"eval_{m}" in own), metric)
            if metric is None or "eval_train_s" not in own:
                continue
            seconds = dict(own["eval_train_s"])
            xy = [(seconds[s], v) for s, v in own[f"eval_{metric}"] if s in seconds]
            fw = r["tags.fxtrack.framework"]
            colour = colours.setdefault(fw, f"C{len(colours)}")
            labelled = fw in ax.get_legend_handles_labels()[1]  # one legend entry per framework
            ax.plot([p[0] for p in xy], [p[1] for p in xy], color=colour, alpha=0.8,
                    label=None if labelled else fw)
        if metric is None:
            plt.close(fig)
            continue
        try:
            ax.axhline(float(target), color="grey", linestyle="--", linewidth=1)
        except (TypeError, ValueError):
            pass
        ax.set_xlabel("training seconds (evaluation and compilation excluded)")
        ax.set_ylabel(f"held-out {metric}")
        title = f"Time to quality: {model} on data={data} ({precision}, {hardware})"
        ax.set_title(title, fontsize=10)
        ax.legend(title="framework", fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        name = "".join(c if c.isalnum() else "_" for c in f"converge_{model}_{data}_{target}_{precision}")
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        drawn.append(Chart(title, path, "each line one run (repeats: one per seed); dashed: "
                                        "the target"))
    return drawn
