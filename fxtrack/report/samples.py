"""The runs a comparison stands on: each benchmark run's config identity, and one config's figure
(a ``Sample``) with the log statistics its intervals need.

Shared by ``fxtrack compare`` (two filtered sides), ``fxtrack claims`` (the arms of a published
claim) and the report's trend charts (one point per framework version). A config stands on its
latest aggregate of repeats (its repeats' own figures where they are in the store, else the
interval the aggregate logged), or on its latest single run: separate runs never pool
(fxtrack/report/identity.py).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable, Optional

import pandas as pd

from fxtrack import stats
from fxtrack.metrics import lookup
from fxtrack.config.frameworks import identity_settings
from fxtrack.report import identity as ident
from fxtrack.report.tables import fmt


def identity() -> dict[str, tuple]:
    """Identity column -> (tag, param): the one declaration, fxtrack/report/identity.py."""
    return ident.declared()


_SELECTED = re.compile(r"\b(params?|tags?|attributes?|metrics?)\.(`[^`]+`|\"[^\"]+\"|'[^']+'|[\w.]+)")


def lower_is_better(key: str) -> bool:
    """Which way a metric improves; ValueError for a key fxtrack does not know."""
    metric = lookup(key)
    if metric is not None and metric.direction != "neither":
        return metric.direction == "lower"
    raise ValueError(f"which way is better for {key!r} is not known: pass --lower-is-better "
                     "or --higher-is-better")


def selected_keys(filter_string: str) -> set[str]:
    """``tags.`fxtrack.model` = 'vit' and params.batch_size = '2'`` -> {"tags.fxtrack.model",
    "params.batch_size"}: what a filter selects on, in the frame's column names."""
    out = set()
    for kind, name in _SELECTED.findall(filter_string or ""):
        kind = {"param": "params", "tag": "tags", "attribute": "attributes",
                "metric": "metrics"}.get(kind, kind)
        out.add(f"{kind}.{name.strip('`' + chr(34) + chr(39))}")
    return out


def identity_columns(frame: pd.DataFrame, *filters: str) -> list[str]:
    """The identity columns pairs are matched on (``identity.columns``: the declared ones, every
    ``model.*`` size key and ``scenario.*`` option), less the ones any of ``filters`` selects on."""
    selected = set().union(*(selected_keys(f) for f in filters)) if filters else set()
    declared = ident.declared()
    cols = list(declared) + ident.options(frame)
    out = []
    for col in cols:
        tag, param = declared.get(col, (None, col))
        if (tag and f"tags.{tag}" in selected) or f"params.{param}" in selected:
            continue
        out.append(col)
    return out


def configs(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per benchmark run of a ``search_runs`` frame: its identity (strings; a lever's
    default where not logged), kind, provenance and metrics. Sweep parents, reports and runs
    that failed or did not finish are left out."""
    runs = ident.read(frame)
    runs["label"] = ident.labels(runs)
    for name, tag in (("kind", "fxtrack.kind"), ("repeat_of", "fxtrack.repeat_of"),
                      ("result_id", "fxtrack.result_id"), ("check", "fxtrack.status"),
                      ("device", "fxtrack.device"), ("framework_version", "fxtrack.framework_version"),
                      ("git_commit", "fxtrack.git_commit"), ("host", "fxtrack.host")):
        runs[name] = ident.column(frame, tag, None)
    runs["run_id"] = frame["run_id"]
    runs["start_time"] = frame["start_time"]
    runs["status"] = frame["status"]
    metrics = [c for c in frame.columns if c.startswith("metrics.")]
    runs = pd.concat([runs, frame[metrics]], axis=1)
    benchmark = runs["framework"] != "-"
    for probe_of in ("tags.fxtrack.serve_probe_of", "tags.fxtrack.fit_of"):
        if probe_of in frame:  # a search's probes: their search's run stands, never a repeat
            benchmark &= frame[probe_of].isna()
    ok = (runs["status"] == "FINISHED") & ~runs["check"].isin(["failed", "guard_failed"])
    return runs[benchmark & ok].sort_values("start_time", kind="stable")


@dataclasses.dataclass
class Sample:
    """One config's figure on one side: the median, the (mean, sd, n) of its log values where
    it has at least two, and the runs it stands on."""

    point: float
    log: Optional[tuple[float, float, int]]
    n: int
    run_ids: list[str]
    rows: pd.DataFrame = dataclasses.field(repr=False)  # the runs, for provenance columns

    def interval(self) -> Optional[tuple[float, float]]:
        """95% Student-t interval of the geometric mean (None for a single run)."""
        if not self.log:
            return None
        mean, sd, n = self.log
        half = stats.t_quantile(0.5 + stats.LEVEL / 2, n - 1) * sd / math.sqrt(n)
        return math.exp(mean - half), math.exp(mean + half)

    def cell(self) -> str:
        return fmt(self.point, 2 if abs(self.point) < 10 else 1) + (f" (n={self.n})" if self.n > 1 else "")


def _from_values(values: list[float], run_ids: list[str], rows: pd.DataFrame) -> Optional[Sample]:
    if not values:
        return None
    log = stats.log_summary(values) if len(values) > 1 and min(values) > 0 else None
    return Sample(stats.median(values), log, len(values), run_ids, rows)


def _from_aggregate(agg: pd.Series, key: str, rows: pd.DataFrame) -> Optional[Sample]:
    """An aggregate's own figures: throughput logs its log mean and sd; a metric with a logged
    ``_ci_low|high`` has them recovered from the t interval (exact: the interval is t on logs)."""
    value = agg.get(f"metrics.{key}")
    if value is None or pd.isna(value):
        return None
    repeats = agg.get("metrics.repeats")
    n = 1 if repeats is None or pd.isna(repeats) else int(repeats)
    log = None
    if key == "throughput_samples_per_s" and not pd.isna(agg.get("metrics.throughput_log_sd", math.nan)):
        log = (float(agg["metrics.throughput_log_mean"]), float(agg["metrics.throughput_log_sd"]), n)
    else:
        low, high = agg.get(f"metrics.{key}_ci_low"), agg.get(f"metrics.{key}_ci_high")
        if n > 1 and low is not None and high is not None and not pd.isna(low) and low > 0:
            half = (math.log(high) - math.log(low)) / 2
            sd = half * math.sqrt(n) / stats.t_quantile(0.5 + stats.LEVEL / 2, n - 1)
            log = ((math.log(high) + math.log(low)) / 2, sd, n)
    return Sample(float(value), log if n > 1 else None, n, [agg["run_id"]], rows)


def sample(group: pd.DataFrame, runs: pd.DataFrame, key: str,
           rule: Optional[Callable[[list], tuple[Optional[list[float]], str]]] = None
           ) -> Optional[Sample]:
    """The figure of ``key`` that one config's runs (``group``, from ``configs``: one identity)
    stand on: its latest repeat group with the figure. An aggregate pools its own repeats
    (``fxtrack.repeat_of``, looked up in ``runs``); separate runs never pool (identity.py).
    ``rule`` (an objective's ``repeats_rule``) picks the repeats the figure stands on from all of
    them (None where a run has no figure): their mean and interval; where it keeps none, the
    median with no interval (no verdict)."""
    col = f"metrics.{key}"
    if col not in group:
        return None
    having = group[group[col].notna() & (group["repeat_of"].isna() | (group["kind"] == "aggregate"))]
    if having.empty:
        return None
    latest = having.iloc[[-1]]
    if latest["kind"].iloc[0] == "aggregate":
        agg = latest.iloc[0]
        reps = runs[(runs["repeat_of"] == agg["result_id"]) & (runs["kind"] != "aggregate")]
        column = reps.get(col, pd.Series(dtype=float))
        if rule is not None:
            return _by_rule(rule, column, [agg["run_id"]], latest)
        values = [float(v) for v in column.dropna()]
        if len(values) > 1:
            return _from_values(values, [agg["run_id"]], latest)
        return _from_aggregate(agg, key, latest)
    return _from_values([float(latest[col].iloc[0])], list(latest["run_id"]), latest)


def _by_rule(rule: Callable[[list], tuple[Optional[list[float]], str]], column: pd.Series,
             run_ids: list[str], rows: pd.DataFrame) -> Optional[Sample]:
    """The repeats' figure as ``rule`` keeps them (a run with none counted as such)."""
    every = [None if pd.isna(v) else float(v) for v in column]
    kept, _ = rule(every)
    if kept:
        log = stats.log_summary(kept) if len(kept) > 1 and min(kept) > 0 else None
        return Sample(sum(kept) / len(kept), log, len(every), run_ids, rows)
    values = [v for v in every if v is not None]
    return Sample(stats.median(values), None, len(every), run_ids, rows) if values else None


def ratio(cand: Sample, base: Sample) -> tuple[float, Optional[tuple[float, float]]]:
    """candidate / baseline medians, with the Welch 95% interval of the geometric means' ratio
    (None when a side has a single run)."""
    point = cand.point / base.point
    interval = stats.ratio_interval(cand.log, base.log) if cand.log and base.log else None
    return point, interval


def describe(config: dict[str, str], varying: list[str]) -> str:
    """``torch vit train fp32 x1 cpu`` plus the identity keys that vary between pairs."""
    fw = config.get("framework", "")
    for key in identity_settings():
        if config.get(key, "-") != "-":
            fw += f"[{config[key]}]"
    head = [fw, config.get("model", ""), config.get("scenario", ""), config.get("precision", ""),
            f"x{config['devices']}" if "devices" in config else "", config.get("hardware", "")]
    rest = [f"{k}={config[k]}" for k in varying if k in config]
    return " ".join(p for p in head + rest if p and p != "-")
