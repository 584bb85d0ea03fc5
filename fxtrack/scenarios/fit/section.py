"""The report's "What fits" section: per model and memory budget, each framework's largest batch
(or sequence) from its latest ``scenario=fit`` run, the throughput there, memory per sample, and
the levers side by side; and a chart of peak memory against the probed value per framework."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import pandas as pd

from fxtrack.report import identity
from fxtrack.scenarios import of_section
from fxtrack.report.tables import Section, Table, fmt

LEVER_TAGS = ("precision", "memory", "parallel", "devices")
INTRO = ("The largest batch_size (or seq_len, scenario.axis=seq_len) each framework trained within "
         "the memory budget: a probe fits when it finished with no out-of-memory error or kill "
         "and its peak (device memory on a GPU, RSS on a CPU) stayed under the budget. Memory per "
         "sample and fixed memory: the least-squares line of peak memory against the value over "
         "the probes that fit (r2: its fit). Ratio: the largest value over the best framework's.")


def _col(frame: pd.DataFrame, name: str) -> pd.Series:
    return frame[name] if name in frame else pd.Series([None] * len(frame), index=frame.index)


def parents(frame: pd.DataFrame) -> pd.DataFrame:
    """The latest finished (or failed) fit parent per framework, model, budget and levers."""
    if frame.empty or "tags.fxtrack.scenario" not in frame:
        return frame.iloc[0:0]
    fits = frame[(_col(frame, "tags.fxtrack.scenario").isin(of_section(__name__)))
                 & _col(frame, "tags.fxtrack.fit_of").isna()
                 & (_col(frame, "tags.fxtrack.fit_axis").notna())].copy()
    if fits.empty:
        return fits
    fits["budget"] = pd.to_numeric(_col(fits, "metrics.memory_budget_gib"), errors="coerce")
    key = ["tags.fxtrack.framework", "tags.fxtrack.model", "tags.fxtrack.fit_axis", "budget",
           "tags.fxtrack.hardware", *(f"tags.fxtrack.{t}" for t in LEVER_TAGS)]
    for column in key:
        if column not in fits:
            fits[column] = None
    # the one comparison identity (report/identity.py): a tiny fit never supersedes a full one
    ident = identity.read(fits)
    fits["label"] = identity.labels(ident)
    fits = pd.concat([fits, ident.add_prefix("identity.")], axis=1)
    fits = fits.sort_values("start_time", kind="stable")
    return fits.drop_duplicates(key + [f"identity.{c}" for c in ident.columns], keep="last")


def _largest(row: pd.Series) -> Optional[float]:
    value = row.get("metrics.max_batch_size")
    return row.get("metrics.max_seq_len") if value is None or pd.isna(value) else value


def section(runs: pd.DataFrame, frame: pd.DataFrame) -> Optional[Section]:
    found = parents(frame)
    if found.empty:
        return None
    tables = []
    for (model, axis, budget, hardware), group in found.groupby(
            ["label", "tags.fxtrack.fit_axis", "budget", "tags.fxtrack.hardware"],
            dropna=False):
        best = max((_largest(r) or 0 for _, r in group.iterrows()), default=0)
        rows = []
        for _, r in group.iterrows():
            top = _largest(r)
            thr = r.get("metrics.throughput_at_max_samples_per_s")
            low, high = r.get("metrics.throughput_at_max_ci_low"), r.get(
                "metrics.throughput_at_max_ci_high")
            interval = "-" if low is None or pd.isna(low) else f"[{low:,.1f}, {high:,.1f}]"
            rows.append([str(r["tags.fxtrack.framework"]),
                         *(str(r.get(f"tags.fxtrack.{t}") or "-") for t in LEVER_TAGS),
                         fmt(top, 0), fmt(thr), interval,
                         fmt(r.get("metrics.memory_per_sample_mib"), 2),
                         fmt(r.get("metrics.fixed_memory_mib"), 0),
                         fmt(r.get("metrics.memory_fit_r2"), 3),
                         fmt(r.get("metrics.fit_probes"), 0),
                         "-" if not best or top is None or pd.isna(top) else f"{top / best:.2f}x",
                         str(r.get("status", ""))])
        title = (f"What fits: {model}, largest {axis} within "
                 f"{'-' if pd.isna(budget) else f'{budget:.2f}'} GiB ({hardware})")
        tables.append(Table(title, ["framework", *LEVER_TAGS, f"largest {axis}",
                                    "samples/s there", "95% interval", "MiB per sample",
                                    "fixed MiB", "r2", "probes", "ratio to best", "status"], rows))
    return Section("What fits", tables, INTRO)


def probes_of(frame: pd.DataFrame, parent_run_id: str, axis: str) -> list[tuple]:
    """(value, peak MiB, fit verdict) of each probe of one fit parent."""
    children = frame[(_col(frame, "tags.mlflow.parentRunId") == parent_run_id)
                     & _col(frame, "tags.fxtrack.fit").notna()]
    column = "params.batch_size" if axis == "batch_size" else "params.model.seq_len"
    out = []
    for _, c in children.iterrows():
        value = pd.to_numeric(c.get(column), errors="coerce")
        peak = c.get("metrics.peak_mem_device_mib")
        if peak is None or pd.isna(peak):
            peak = c.get("metrics.peak_rss_mib")
        if pd.notna(value):
            out.append((float(value), None if peak is None or pd.isna(peak) else float(peak),
                        str(c["tags.fxtrack.fit"])))
    return sorted(out)


def plot(series: dict[str, tuple[list[tuple], Optional[float], Optional[float]]],
         budget_mib: Optional[float], path: Path, xlabel: str) -> Path:
    """Peak memory against the probed value: each series' probes (filled: fits; hollow: not),
    its fitted line, and the budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    top = 0.0
    for label, (points, slope, intercept) in sorted(series.items()):
        shown = [(x, y, f) for x, y, f in points if y is not None]
        if not shown:
            continue
        colour = ax.plot([], [])[0].get_color()
        ok = [(x, y) for x, y, f in shown if f == "fits"]
        miss = [(x, y) for x, y, f in shown if f != "fits"]
        if ok:
            ax.scatter(*zip(*ok), color=colour, label=f"{label} (fits)")
        if miss:
            ax.scatter(*zip(*miss), facecolors="none", edgecolors=colour,
                       label=f"{label} (does not fit)")
        if slope is not None and intercept is not None:
            xs = [0, max(x for x, _, _ in shown)]
            ax.plot(xs, [intercept + slope * x for x in xs], color=colour, linewidth=1)
        top = max(top, *(y for _, y, _ in shown))
    if budget_mib is not None:
        ax.axhline(budget_mib, color="red", linestyle="--", linewidth=1, label="budget")
        top = max(top, budget_mib)
    ax.set_ylim(0, top * 1.1 or 1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("peak memory (MiB)")
    ax.set_title("Peak memory against " + xlabel.removeprefix("probe "))
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def charts(frame: pd.DataFrame, runs: pd.DataFrame, out: Path, histories: Callable) -> list:
    """One chart per model, axis and budget: every framework's probes, lines and the budget."""
    from fxtrack.report.charts import Chart

    found = parents(frame)
    if found.empty:
        return []
    drawn = []
    for (model, axis, budget), group in found.groupby(
            ["tags.fxtrack.model", "tags.fxtrack.fit_axis", "budget"], dropna=False):
        series = {}
        for _, r in group.iterrows():
            label = " ".join(str(r.get(f"tags.fxtrack.{t}") or "") for t in
                             ("framework", "precision", "memory", "parallel")).strip()
            series[label] = (probes_of(frame, r["run_id"], axis),
                             r.get("metrics.memory_per_sample_mib"),
                             r.get("metrics.fixed_memory_mib"))
        budget_mib = None if pd.isna(budget) else float(budget) * 1024
        name = "".join(c if c.isalnum() else "_" for c in f"fit_{model}_{axis}_{budget}")
        path = plot(series, budget_mib, out / f"{name}.png", f"probe {axis}")
        drawn.append(Chart(f"What fits: peak memory of {model} against {axis}", path,
                           "filled: probes that fit; hollow: out of memory, over budget or "
                           "killed; lines: least squares over the fitting probes; dashed: budget"))
    return drawn


def closing_table(jobs: list[dict], aggregates: list[dict]) -> str:
    """The sweep's fit jobs as a text table (empty when there are none): the answer, the
    throughput there, memory per sample, fixed memory, probes and why the search stopped."""
    rows = []
    for j in jobs:
        m, t = j.get("metrics", {}), j.get("tags", {})
        if "fit_probes" not in m:
            continue
        best = m.get("max_batch_size", m.get("max_seq_len"))
        low, high = m.get("throughput_at_max_ci_low"), m.get("throughput_at_max_ci_high")
        rows.append([j["name"], t.get("fxtrack.fit_axis", "?"), _num(best, 0),
                     _num(m.get("throughput_at_max_samples_per_s"), 1),
                     "-" if low is None else f"[{low:,.1f}, {high:,.1f}]",
                     _num(m.get("memory_per_sample_mib"), 2), _num(m.get("fixed_memory_mib"), 0),
                     _num(m.get("memory_fit_r2"), 3), _num(m.get("memory_budget_gib"), 2),
                     _num(m.get("fit_probes"), 0), t.get("fxtrack.fit_stop", "-")])
    if not rows:
        return ""
    from fxtrack.report.render import text_table

    return "\n".join(["", text_table(Table(
        "What fits (largest value within the budget; samples/s at it):",
        ["run", "axis", "largest", "samples/s", "95% interval", "MiB/sample", "fixed MiB", "r2",
         "budget GiB", "probes", "stopped by"], rows)), ""])


def _num(value: Optional[float], digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"
