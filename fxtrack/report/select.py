"""Pick the runs a report stands on: the latest finished run (or repeats' aggregate) of each benchmark.

A benchmark is one comparison identity (fxtrack/report/identity.py: framework, model and its
dims, scenario and its options, precision, devices, hardware, batch, levers). Re-running it
supersedes the earlier run, so the report always shows the newest figures; runs of another
identity (another size, batch or serve rate) are kept beside it, each labelled. With ``repeats=N``
the config's aggregate run (median and interval, ``fxtrack.kind=aggregate``) stands for it and
its repeats (``fxtrack.repeat_of``) are counted in it, not ranked alone. Runs that are not
benchmarks (sweep parents, report runs: no ``fxtrack.framework`` tag), failed runs and runs still
in progress are left out and counted, so the report can say what it skipped.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from fxtrack import scenarios
from fxtrack.metrics import CAVEATS

from fxtrack.config.frameworks import declared, identity_settings
from fxtrack.report import identity

KEY = ["framework", "model", "scenario", "precision", "devices", "hardware"]  # a table's cell
# The report's own column names for the run tags (docs/contract.md#tags).
TAGS = {
    "framework": "fxtrack.framework", "model": "fxtrack.model", "scenario": "fxtrack.scenario",
    "precision": "fxtrack.precision", "devices": "fxtrack.devices", "hardware": "fxtrack.hardware",
    "check": "fxtrack.status", "guard": "fxtrack.guard", "run_name": "mlflow.runName",
    "device": "fxtrack.device", "cpu": "fxtrack.cpu", "host": "fxtrack.host",
    "framework_version": "fxtrack.framework_version", "python": "fxtrack.python",
    "worker_python": "fxtrack.worker_python", "fxtrack_version": "fxtrack.version",
    "git_commit": "fxtrack.git_commit", "driver": "fxtrack.driver", "cuda": "fxtrack.cuda",
    "cudnn": "fxtrack.cudnn", "kind": "fxtrack.kind", "repeats": "fxtrack.repeats",
    "repeat_of": "fxtrack.repeat_of", "contended": "fxtrack.contended", "noisy": "fxtrack.noisy",
    "peak_mem_device_kind": "fxtrack.peak_mem_device_kind",
    "model_kind": "fxtrack.model_kind", "seq_len": "fxtrack.seq_len",
}
# Per-step series: search_runs returns only their last step, which is not a summary figure.
SERIES = {"step_time_ms", "loss"}
# Report order of scenarios and precisions (frameworks: their declared report_order, frameworks()); any
# other value follows alphabetically.
SCENARIO_ORDER = scenarios.names()  # the registry's order
PRECISION_ORDER = ("fp32", "bf16", "fp16")


@dataclasses.dataclass
class Selection:
    """The kept runs (one row per benchmark) and how many of the runs read were left out, why."""

    runs: pd.DataFrame  # KEY + tag columns above + "run_id", "start_time", "metrics.<key>"
    read: int
    skipped: dict[str, int]

    def summary(self) -> str:
        """``12 runs read, 6 kept (3 superseded, 2 failed, 1 not a benchmark)``."""
        left = ", ".join(f"{n} {why}" for why, n in self.skipped.items() if n)
        return f"{self.read} runs read, {len(self.runs)} kept" + (f" ({left})" if left else "")


def latest_runs(frame: pd.DataFrame) -> Selection:
    """The latest FINISHED run per benchmark from a ``search_runs``-layout frame."""
    runs = pd.DataFrame({name: _tag(frame, tag) for name, tag in TAGS.items()})
    # the tags frameworks declare the report reads (Framework.held_twice)
    for held in (fw.held_twice for fw in declared().values() if fw.held_twice):
        runs[held.tag] = _tag(frame, f"fxtrack.{held.tag}")
    # a framework's identity setting (Keras's backend) makes a column of its own (keras-jax)
    for key in identity_settings():
        value = _tag(frame, f"fxtrack.{key}")
        on = value.notna() & runs["framework"].notna()
        runs.loc[on, "framework"] = (runs.loc[on, "framework"].astype(str) + "-"
                                     + value[on].astype(str))
    # a GPU that throttled for power or heat measured its cooling: marked as a contended run is
    throttled = _tag(frame, "fxtrack.gpu_throttled").notna()
    runs.loc[throttled, "contended"] = "true"
    for caveat in CAVEATS:  # the tags that qualify a figure: each table writes them beside it
        runs[f"caveat.{caveat.tag}"] = _tag(frame, f"fxtrack.{caveat.tag}")
    runs["run_id"] = frame["run_id"].to_numpy()
    runs["status"] = frame["status"].to_numpy()
    runs["start_time"] = frame["start_time"].to_numpy()
    runs["end_time"] = frame["end_time"].to_numpy()
    # the comparison identity of each run; the model named by the dims that ran
    ident = identity.read(frame).reset_index(drop=True)
    ident_cols = [f"identity.{c}" for c in ident.columns]
    runs = pd.concat([runs, ident.set_axis(ident_cols, axis=1)], axis=1)
    runs["size"] = ident["size"].where(ident["size"] != "-", None)
    runs["label"] = identity.labels(ident).to_numpy()
    metric_cols = [c for c in frame.columns
                   if c.startswith("metrics.") and c[len("metrics."):] not in SERIES
                   and not c.startswith("metrics.system/")]  # sampled series (measure/system.py)
    runs = pd.concat([runs, frame[metric_cols].reset_index(drop=True)], axis=1)

    # A repeat whose config has an aggregate run counts through that aggregate, not on its own.
    repeat = runs["repeat_of"].fillna("").astype(str).str.len() > 0
    probe = pd.Series(False, index=runs.index)
    for probe_of in (f"tags.fxtrack.{tag}" for tag in scenarios.probe_tags()):
        if probe_of in frame:  # a search's probes (fit, serve) count through their parent
            probe |= (frame[probe_of].fillna("").astype(str).str.len() > 0).to_numpy()
    folded = repeat | probe
    tagged = runs["framework"].fillna("").astype(str).str.len() > 0
    # A lever variant (runtime=onnxruntime, parallel=fsdp, ...) is a cell of the levers' tables
    # (report/levers.py), not a competitor of the default run in the main tables.
    variant = pd.Series(False, index=frame.index)
    for lever, default in identity.LEVERS.items():
        if f"params.{lever}" in frame:
            variant |= frame[f"params.{lever}"].fillna(default) != default
    variant = variant.to_numpy()
    benchmark = tagged & ~folded & ~variant
    # A repeats aggregate stopped by a signal or a kill keeps its finished repeats' figures
    # (``repeats`` says how many): they stand, as their repeats' runs do (issue 60).
    stopped = runs["status"].isin(["FAILED", "KILLED"])
    kept_repeats = pd.to_numeric(frame.get("metrics.repeats", pd.Series(index=frame.index,
                                                                        dtype=float)),
                                 errors="coerce").fillna(0).to_numpy()
    partial = benchmark & (runs["kind"] == "aggregate") & stopped & (kept_repeats > 0)
    failed = benchmark & ~partial & ((runs["check"] == "failed") | stopped)
    finished = benchmark & ~failed & ((runs["status"] == "FINISHED") | partial)
    runs.loc[partial, "check"] = "ok"  # the figures are the finished repeats': nothing failed
    kept = runs[finished].copy()
    kept["devices"] = pd.to_numeric(kept["devices"], errors="coerce").fillna(1).astype(int)
    for col in ("model", "scenario", "precision", "hardware"):
        kept[col] = kept[col].fillna("?")
    kept["check"] = kept["check"].fillna("ok")
    # How many repeats each figure stands on: an aggregate says; a single run is one.
    kept["repeats"] = pd.to_numeric(kept["repeats"], errors="coerce").fillna(1).astype(int)
    # Latest by start time; the end time breaks ties between runs started in the same millisecond.
    kept = kept.sort_values(["start_time", "end_time"], kind="stable")
    latest = kept.drop_duplicates(ident_cols, keep="last").copy()
    # several identities of one model in one table: each row says what sets it apart
    apart = identity.apart(latest[ident_cols].rename(columns=lambda c: c[len("identity."):]),
                           ["model", "size", "scenario", "precision", "devices", "hardware"])
    latest["label"] = [f"{label} [{extra}]" if extra else label
                       for label, extra in zip(latest["label"], apart)]

    order = {"scenario": SCENARIO_ORDER, "precision": PRECISION_ORDER,
             "framework": framework_order()}
    latest = latest.sort_values(
        ["scenario", "precision", "devices", "hardware", "model", "framework"],
        key=lambda col: col.map(lambda v: _rank(v, order[col.name])) if col.name in order else col)
    empty = [c for c in metric_cols if latest[c].isna().all()]  # logged only by dropped runs
    latest = latest.drop(columns=empty).reset_index(drop=True)
    skipped = {
        "superseded by a later run": len(kept) - len(latest),
        "failed": int(failed.sum()),
        "not finished": int((benchmark & ~failed & ~finished).sum()),
        "repeats counted in their aggregate": int((repeat & ~probe).sum()),
        "probes counted in their search (fit, serve)": int(probe.sum()),
        "lever variants (deployment / memory tables)": int((tagged & ~folded & variant).sum()),
        "without fxtrack.framework (sweep parents, reports)": int((~tagged).sum()),
    }
    return Selection(latest, len(frame), skipped)


def _rank(value: str, order: tuple[str, ...]) -> str:
    """A sort key putting ``order``'s values first, in that order, then the rest alphabetically;
    ``keras-jax`` ranks where ``keras`` does, then by its backend."""
    base, _, variant = str(value).partition("-")
    if value not in order and base in order:
        return f"{order.index(base):03d}{variant}"
    return f"{order.index(value):03d}" if value in order else f"999{value}"


def framework_order() -> tuple[str, ...]:
    """The declared frameworks in report order (each declaration's ``report_order``); a
    framework no config declares follows them alphabetically (``_rank``)."""
    from fxtrack.config.frameworks import declared

    return tuple(declared())


def frameworks(runs: pd.DataFrame) -> list[str]:
    """The frameworks present in ``runs``, in report order."""
    order = framework_order()
    return sorted(runs["framework"].unique(), key=lambda f: _rank(f, order))


def by_model(runs: pd.DataFrame) -> str:
    """The column a table's rows go by: the model as its dims and identity name it (``label``,
    from ``latest_runs``), or the model's name in a frame built without it."""
    return "label" if "label" in runs.columns else "model"


def metric(row: pd.Series, key: str) -> float | None:
    """A run's metric, or None where it was not logged (absent, never zero: docs/contract.md#metrics)."""
    value = row.get(f"metrics.{key}")
    return None if value is None or pd.isna(value) else float(value)


def _tag(frame: pd.DataFrame, tag: str) -> pd.Series:
    column = f"tags.{tag}"
    if column in frame.columns:
        values = frame[column].astype(object).reset_index(drop=True)
        return values.where(values.notna(), None)
    return pd.Series([None] * len(frame), dtype=object)
