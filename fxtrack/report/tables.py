"""The report's tables, as plain strings ready for any renderer (terminal, Markdown, HTML).

Each comparison table holds one (scenario, precision, devices, hardware) group: figures from
different settings are never put side by side. Rows are models, columns frameworks.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterator, Optional

import pandas as pd

from fxtrack import architectures
from fxtrack.config.frameworks import declared
from fxtrack.report.select import by_model, frameworks, metric

FLAG = "!"  # marks a run that failed the correctness guard
CONTENDED = "c"  # marks a run (or any repeat of it) measured while other processes took the cores
DIFFERENT = "#"  # marks a model whose parameter count differs between frameworks (a user's model)
GROUP = ["scenario", "precision", "devices", "hardware"]
_SCALING = re.compile(r"^metrics\.scaling_efficiency_x(\d+)$")
_SLOC = re.compile(r"^metrics\.code_sloc_(.+)$")
Formatter = Callable[[Optional[float]], str]


@dataclasses.dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = dataclasses.field(default_factory=list)
    whole: tuple[str, ...] = ()  # headers of the columns a terminal table never wraps


@dataclasses.dataclass
class Section:
    title: str
    tables: list[Table]
    intro: str = ""


def fmt(value: Optional[float], digits: int = 1) -> str:
    """``1234.56`` -> ``1,234.6``; None -> ``-``."""
    return "-" if value is None else f"{value:,.{digits}f}"


def fmt_ms(value: Optional[float]) -> str:
    """Step times keep two decimals below 10 ms, where one would hide real differences."""
    return fmt(value, 2 if value is not None and value < 10 else 1)


def group_title(key: tuple) -> str:
    scenario, precision, devices, hardware = key
    return f"{scenario}, {precision}, x{devices}, {hardware}"


def groups(runs: pd.DataFrame) -> Iterator[tuple[tuple, pd.DataFrame]]:
    """(scenario, precision, devices, hardware) groups, in report order (``runs`` is sorted)."""
    yield from runs.groupby(GROUP, sort=False)


def _grid(runs: pd.DataFrame, title: str, cell: Callable[[pd.Series, pd.DataFrame], Optional[str]],
          notes: list[str]) -> list[Table]:
    """One model x framework table per group; groups where no cell has a figure are left out."""
    tables = []
    for key, group in groups(runs):
        fws = frameworks(group)
        rows = []
        differ = []
        for model, peers in group.groupby(by_model(group), sort=True):
            cells = {r["framework"]: cell(r, peers) for _, r in peers.iterrows()}
            note = param_difference(model, peers)
            differ += [note] if note else []
            rows.append([f"{model} {DIFFERENT}" if note else model]
                        + [cells.get(fw) or "-" for fw in fws])
        if any(c != "-" for row in rows for c in row[1:]):
            flagged = group[group["check"] != "ok"]
            extra = [f"{FLAG} {r['framework']} {r['model']}: failed the correctness guard"
                     + (f" ({r['guard']})" if r.get("guard") else "")
                     for _, r in flagged.iterrows()] + differ
            tables.append(Table(f"{title}: {group_title(key)}", ["model", *fws], rows,
                                notes + extra))
    return tables


def param_difference(model: str, by_model: pd.DataFrame) -> Optional[str]:
    """A note when the frameworks' ``param_count`` for ``model`` differ (then it is not the same
    model in each: a user's builders that disagree), saying by how much; None when they agree."""
    counts = {r["framework"]: int(v) for _, r in by_model.iterrows()
              if (v := metric(r, "param_count")) is not None}
    if len(set(counts.values())) < 2:
        return None
    low = min(counts.values())
    spread = (max(counts.values()) - low) / low if low else float("inf")
    listed = ", ".join(f"{fw} {n:,}" for fw, n in counts.items())
    return (f"{DIFFERENT} {model}: parameter counts differ between frameworks ({listed}; "
            f"{spread:+.1%} largest vs smallest): not the same model")


def _flag(row: pd.Series) -> str:
    return f" {FLAG}" if row["check"] != "ok" else ""


def throughput(runs: pd.DataFrame) -> list[Table]:
    """Samples/s with each cell's ratio to the best framework for that model."""
    def cell(row: pd.Series, peers: pd.DataFrame) -> Optional[str]:
        value = metric(row, "throughput_samples_per_s")
        best = reference(peers, "throughput_samples_per_s")
        if value is None or not best:
            return None
        rel = metric(row, "throughput_rel_ci")  # an aggregate of repeats: its 95% interval
        spread = "" if rel is None else f" ±{rel / 2:.1%}"
        busy = f" {CONTENDED}" if str(row.get("contended")) == "true" else ""
        return f"{fmt(value)}{spread} ({value / best:.2f}x){_flag(row)}{busy}"

    return _grid(runs, "Throughput (samples/s)", cell,
                 ["(ratio) = throughput / the best framework for that model: best = 1.00x",
                  "with repeats: the median, ± half the 95% Student-t interval as a share of it",
                  f"{CONTENDED} = contended: other processes took > 10% of the cores while it ran"])


def reference(peers: pd.DataFrame, key: str) -> Optional[float]:
    """The best figure among runs that passed the correctness guard (all runs if none did):
    a run with a diverged loss must not set the bar the others are measured against."""
    passed = peers[peers["check"] == "ok"]
    values = [v for _, r in (passed if len(passed) else peers).iterrows()
              if (v := metric(r, key)) is not None]
    return max(values) if values else None


def step_time(runs: pd.DataFrame) -> list[Table]:
    def cell(row: pd.Series, _) -> Optional[str]:
        p50, p90 = metric(row, "step_time_ms_p50"), metric(row, "step_time_ms_p90")
        if p50 is None and p90 is None:
            return None
        return f"{fmt_ms(p50)} / {fmt_ms(p90)}{_flag(row)}"

    return _grid(runs, "Step time p50 / p90 (ms)", cell, ["lower is better"])


def _held_twice(row: pd.Series) -> bool:
    """Whether the run's peak held the training state twice, as its framework declares
    (``Framework.held_twice``: JAX without donation)."""
    held = _held_twice_of().get(str(row.get("framework") or "").split("-")[0])
    return held is not None and str(row.get(held.tag) or "").startswith(held.prefix)


def _held_twice_of() -> dict:
    return {name: fw.held_twice for name, fw in declared().items() if fw.held_twice}


def memory(runs: pd.DataFrame) -> list[Table]:
    def cell(row: pd.Series, _) -> Optional[str]:
        device, rss = metric(row, "peak_mem_device_mib"), metric(row, "peak_rss_mib")
        twice = " 2x" if _held_twice(row) else ""
        if device is not None:
            return f"{fmt(device, 0)} device{twice}{_flag(row)}"
        return None if rss is None else f"{fmt(rss, 0)} RSS{twice}{_flag(row)}"

    notes = ["device: the framework's own peak on the device (peak_mem_device_mib); RSS: the "
             "worker's peak resident memory (peak_rss_mib), shown where no device figure exists"]
    kinds = sorted({(str(fw), str(kind)) for fw, kind in
                    zip(runs.get("framework", []), runs.get("peak_mem_device_kind", []))
                    if isinstance(kind, str) and kind})
    if kinds:  # each allocator counts something else: the comparison says which it compares
        notes.append("device counters: " + "; ".join(f"{fw} {kind}" for fw, kind in kinds)
                     + ", not the same kind of figure: compare across frameworks NVML's "
                     "peak_mem_nvml_mib")
    held = runs[runs.apply(_held_twice, axis=1)] if len(runs) else runs
    for name in sorted({str(f).split("-")[0] for f in held.get("framework", [])}):
        notes.append(f"2x = the training state was held twice: {_held_twice_of()[name].note}")
    return _grid(runs, "Peak memory (MiB)", cell, notes)


def mfu(runs: pd.DataFrame) -> list[Table]:
    def cell(row: pd.Series, _) -> Optional[str]:
        value = metric(row, "mfu")
        return None if value is None else f"{value:.1%}{_flag(row)}"

    return _grid(runs, "MFU % (model FLOP utilisation)", cell,
                 ["achieved model FLOP/s / (devices x peak FLOP/s of one device); the logged "
                  "metric mfu is the same as a fraction (0.25 = 25%)"])


def scaling_points(runs: pd.DataFrame) -> dict[tuple, dict[int, tuple[float, bool]]]:
    """(framework, model, precision, hardware) -> {devices: (efficiency, derived)}.

    Logged ``scaling_efficiency_x{N}`` metrics come first. Where a benchmark was run at 1 and
    at N devices without them, efficiency is derived as throughput_N / (N x throughput_1).
    """
    points: dict[tuple, dict[int, tuple[float, bool]]] = {}
    for _, row in runs.sort_values("start_time").iterrows():  # a later run's figure wins
        key = (row["framework"], row["model"], row["precision"], row["hardware"])
        for col in runs.columns:
            if (m := _SCALING.match(col)) and not pd.isna(row[col]):
                points.setdefault(key, {})[int(m.group(1))] = (float(row[col]), False)
    for (fw, model, scenario, precision, hw), by_dev in runs.groupby(
            ["framework", "model", "scenario", "precision", "hardware"]):
        base = by_dev[by_dev["devices"] == 1]
        one = metric(base.iloc[0], "throughput_samples_per_s") if len(base) else None
        if not one:
            continue
        for _, row in by_dev[by_dev["devices"] > 1].iterrows():
            n, thr = int(row["devices"]), metric(row, "throughput_samples_per_s")
            series = points.setdefault((fw, model, precision, hw), {})
            if thr is not None and n not in series:
                series[n] = (thr / (n * one), True)
    return {k: v for k, v in points.items() if v}


def scaling(runs: pd.DataFrame) -> list[Table]:
    points = scaling_points(runs)
    if not points:
        return []
    counts = sorted({n for series in points.values() for n in series})
    rows = []
    for (fw, model, precision, hw), series in sorted(points.items()):
        cells = [f"{series[n][0]:.1%}" + ("*" if series[n][1] else "") if n in series else "-"
                 for n in counts]
        rows.append([model, fw, precision, hw, *cells])
    notes = ["efficiency = throughput at N devices / (N x throughput at 1 device); 100% is linear"]
    if any(d for series in points.values() for _, d in series.values()):
        notes.append("* derived from the throughput of separate runs at 1 and N devices")
    return [Table("Scaling efficiency by device count",
                  ["model", "framework", "precision", "hardware", *[f"x{n}" for n in counts]],
                  rows, notes)]


def code_size(runs: pd.DataFrame) -> list[Table]:
    """SLOC per API dimension of each framework in the report, counted in this fxtrack's source
    (the runs no longer carry it: it is the same on every run of a version; a sweep's parent
    logs it too, as code_sloc.<framework> params and code_size.csv)."""
    import fxtrack
    from fxtrack.measure.complexity import code_metrics

    tables = []
    user = runs["model"].map(architectures.runs_carry_model_code).astype(bool)
    own = runs[~user]
    # keras-jax, keras-torch: one implementation, counted once
    fws = list(dict.fromkeys(fw.partition("-")[0] for fw in frameworks(own))) if len(own) else []
    if fws:
        tables.append(_code_table("Code size (SLOC) per API dimension",
                                  {fw: code_metrics(fw) for fw in fws},
                                  f"source lines of each framework's implementation in fxtrack "
                                  f"{fxtrack.__version__}; fewer is less to maintain"))
    custom = runs[user]
    if len(custom):  # a user's model: its runs carry their builder module's figures
        figures = {row["framework"]: {k[len("metrics."):]: v for k, v in row.items()
                                      if str(k).startswith("metrics.code_") and pd.notna(v)}
                   for _, row in custom.iterrows()}
        if any(figures.values()):
            tables.append(_code_table("Code size (SLOC) per API dimension: model=custom", figures,
                                      "the model dimension is your builder's module; the rest "
                                      "is fxtrack's glue to it in each framework"))
    return tables


def _code_table(title: str, figures: dict[str, dict[str, float]], note: str) -> Table:
    fws = list(figures)
    dims = sorted({m.group(1) for f in figures.values() for k in f
                   if (m := _SLOC.match(f"metrics.{k}"))})
    rows = [[dim] + [fmt(figures[fw].get(f"code_sloc_{dim}"), 0) for fw in fws] for dim in dims]
    rows.append(["total"] + [fmt(figures[fw].get("code_sloc"), 0) for fw in fws])
    return Table(title, ["dimension", *fws], rows, [note])


def _long(runs: pd.DataFrame, title: str, columns: dict[str, tuple[str, Formatter]],
          notes: list[str]) -> list[Table]:
    """One row per run that logged any of ``columns`` (metric key -> (header, formatter)).

    The first key is context (training throughput), shown only beside the scenario's own keys.
    """
    own = [k for k in list(columns)[1:] if f"metrics.{k}" in runs.columns]
    if not own:
        return []
    keys = [k for k in columns if f"metrics.{k}" in runs.columns]
    rows = []
    for _, row in runs[runs[[f"metrics.{k}" for k in own]].notna().any(axis=1)].iterrows():
        rows.append([row["model"], row["framework"] + _flag(row), row["precision"],
                     f"x{row['devices']}", row["hardware"],
                     *[columns[k][1](metric(row, k)) for k in keys]])
    header = ["model", "framework", "precision", "devices", "hardware"]
    return [Table(title, header + [columns[k][0] for k in keys], rows, notes)]


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1%}"


def _seconds(value: Optional[float]) -> str:
    return fmt(value, 2)  # sub-second saves are common: one decimal would read as 0.0


def pipeline(runs: pd.DataFrame) -> list[Table]:
    return _long(runs, "Input pipeline", {
        "throughput_samples_per_s": ("train samples/s", fmt),
        "pipeline_samples_per_s": ("pipeline samples/s", fmt),
        "input_bound_fraction": ("input-bound", _pct)},
        ["input-bound: share of step time spent waiting for the input pipeline"])


def checkpoint(runs: pd.DataFrame) -> list[Table]:
    return _long(runs, "Checkpoint and export", {
        "throughput_samples_per_s": ("train samples/s", fmt),
        "checkpoint_save_s": ("save s", _seconds), "checkpoint_restore_s": ("restore s", _seconds),
        "checkpoint_mib": ("checkpoint MiB", fmt), "export_s": ("export s", _seconds),
        "export_mib": ("export MiB", fmt)}, [])


def environment(runs: pd.DataFrame) -> list[Table]:
    """The hardware and software behind the numbers; more than one value in a cell means the
    compared runs did not all share it."""
    def values(frame: pd.DataFrame, col: str) -> str:
        if col not in frame.columns:
            return "-"
        found = sorted({str(v) for v in frame[col] if v is not None and not pd.isna(v)})
        return ", ".join(found) or "-"

    hardware = []
    for (host, hw), frame in runs.groupby([runs["host"].fillna("?"), "hardware"], sort=True):
        hardware.append([host, hw, values(frame, "device"), values(frame, "cpu"),
                         values(frame, "driver"), values(frame, "cuda"), str(len(frame))])
    python = runs["worker_python"].fillna(runs["python"])  # the worker's interpreter ran the model
    software = []
    for fw in frameworks(runs):
        frame = runs[runs["framework"] == fw].assign(_py=python)
        software.append([fw, values(frame, "framework_version"), values(frame, "_py"),
                         values(frame, "fxtrack_version"), values(frame, "git_commit"),
                         values(frame, "host")])
    return [
        Table("Hardware", ["host", "hardware", "device", "cpu", "driver", "cuda", "runs"],
              hardware),
        Table("Software", ["framework", "version", "python", "fxtrack", "commit", "hosts"],
              software),
    ]


def sections(runs: pd.DataFrame) -> list[Section]:
    """Every section that has data, throughput first (it is what the terminal shows)."""
    built = [
        Section("Throughput", throughput(runs)),
        Section("Step time", step_time(runs)),
        Section("Peak memory", memory(runs)),
        Section("MFU", mfu(runs)),
        Section("Scaling", scaling(runs)),
        Section("Code size", code_size(runs)),
        Section("Input pipeline", pipeline(runs)),
        Section("Checkpoint and export", checkpoint(runs)),
        Section("Hardware and software", environment(runs),
                "The machines and versions the kept runs were measured with."),
    ]
    return [s for s in built if s.tables]
