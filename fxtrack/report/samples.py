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

from fxtrack import scenarios, stats
from fxtrack.metrics import CAVEATS, caveat_words, lookup
from fxtrack.config.frameworks import identity_settings
from fxtrack.report import identity as ident
from fxtrack.report import select
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
    # sides that differ by framework pair their runs across its own settings
    return out if "framework" in out else ident.across_frameworks(out)


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
    for caveat in CAVEATS:  # the tags that qualify a figure, carried to every place it appears
        runs[f"caveat.{caveat.tag}"] = ident.column(frame, f"fxtrack.{caveat.tag}", None)
    runs["run_id"] = frame["run_id"]
    runs["start_time"] = frame["start_time"]
    runs["status"] = frame["status"]
    metrics = [c for c in frame.columns if c.startswith("metrics.")]
    runs = pd.concat([runs, frame[metrics]], axis=1)
    benchmark = runs["framework"] != "-"
    for probe_of in (f"tags.fxtrack.{tag}" for tag in scenarios.probe_tags()):
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
    # every run's figure of the group (None: it has none, e.g. missed its target), as the
    # rule saw them; why the rule kept none ("" where it did)
    values: list = dataclasses.field(default_factory=list)
    why: str = ""
    # the declared caveats (fxtrack.metrics.CAVEATS) on any run it stands on, and the rule's
    caveats: tuple[str, ...] = ()
    earlier: Optional[int] = None  # an earlier group of this identity held more runs: its n
    members: list = dataclasses.field(default_factory=list)  # the run ids it stands on

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
    """The one figure of ``key`` for one identity's runs (``group``, from ``configs``): every
    place a figure appears asks this. The identity's latest repeat group (an aggregate with its
    repeats, looked up in ``runs``) or single run stands, pooled by the metric's rule: ``rule``
    (an objective's ``repeats_rule``: which repeats it keeps, None where a run has no figure),
    their mean and interval, else the median with no interval; without a rule, the median and
    the t interval of the repeats. Separate runs never pool (identity.py). Without a rule, a
    latest group that logged no such figure leaves it to the latest that did (a metric logged
    only on request, as a cost). The figure carries the declared caveats of every run it stands
    on and the n of an earlier, larger group it replaced."""
    col = f"metrics.{key}"
    if col not in group:
        return None
    heads = group[group["repeat_of"].isna() | (group["kind"] == "aggregate")]
    if rule is None:
        heads = heads[heads[col].notna()]
    if heads.empty:
        return None
    head = heads.iloc[-1]
    found = _pooled(head, heads.iloc[[-1]], runs, col, key, rule)
    if found is None:
        return None
    stood = _members(head, runs)
    scenario = str(head.get("scenario", ""))
    marks = caveat_words(scenario, lambda tag: f"caveat.{tag}" in stood
                         and bool((stood[f"caveat.{tag}"] == "true").any()))
    if found.why:
        marks.append(found.why)
    earlier = max((_size(h, runs) for _, h in heads.iloc[:-1].iterrows()), default=0)
    found.caveats = tuple(marks)
    found.members = list(stood["run_id"])
    found.earlier = earlier if earlier > found.n else None
    return found


def _members(head: pd.Series, runs: pd.DataFrame) -> pd.DataFrame:
    """The runs a group's head stands for: an aggregate and its repeats, or the run itself."""
    if head.get("kind") == "aggregate" and "repeat_of" in runs:
        return pd.concat([head.to_frame().T, runs[runs["repeat_of"] == head["result_id"]]])
    return head.to_frame().T


def _size(head: pd.Series, runs: pd.DataFrame) -> int:
    """How many runs a group holds (an aggregate's repeats, else one)."""
    if head.get("kind") != "aggregate":
        return 1
    reps = int(((runs["repeat_of"] == head["result_id"]) & (runs["kind"] != "aggregate")).sum())
    logged = head.get("metrics.repeats")
    return reps or (1 if logged is None or pd.isna(logged) else int(logged))


def _pooled(head: pd.Series, latest: pd.DataFrame, runs: pd.DataFrame, col: str, key: str,
            rule: Optional[Callable[[list], tuple[Optional[list[float]], str]]]) -> Optional[Sample]:
    if head["kind"] == "aggregate":
        reps = runs[(runs["repeat_of"] == head["result_id"]) & (runs["kind"] != "aggregate")]
        column = reps.get(col, pd.Series(dtype=float))
        if rule is not None:
            return by_rule(rule, column, [head["run_id"]], latest)
        values = [float(v) for v in column.dropna()]
        if len(values) > 1:
            return _from_values(values, [head["run_id"]], latest)
        return _from_aggregate(head, key, latest)
    if rule is not None:
        return by_rule(rule, latest[col], list(latest["run_id"]), latest)
    return _from_values([float(latest[col].iloc[0])], list(latest["run_id"]), latest)


def by_rule(rule: Callable[[list], tuple[Optional[list[float]], str]], column: pd.Series,
            run_ids: list[str], rows: pd.DataFrame) -> Sample:
    """The group's figure as ``rule`` keeps its runs (a run with none counted as such): the
    mean of the kept and their interval; where it keeps none, the median of those with a
    figure and no interval (no verdict), the rule's reason beside it; NaN where no run has
    a figure (its runs are still counted)."""
    every = [None if pd.isna(v) else float(v) for v in column]
    kept, why = rule(every)
    if kept:
        log = stats.log_summary(kept) if len(kept) > 1 and min(kept) > 0 else None
        return Sample(sum(kept) / len(kept), log, len(every), run_ids, rows, every)
    values = [v for v in every if v is not None]
    point = stats.median(values) if values else math.nan
    return Sample(point, None, len(every), run_ids, rows, every, why)


# What an aggregate logs about its group rather than as one of its repeats' figures: the
# interval fields are restated from the pooled sample below, the worst host load is kept.
_OF_THE_GROUP = {"repeats", "host_other_cpu_frac", "throughput_ci_low", "throughput_ci_high",
                 "throughput_rel_ci", "throughput_log_mean", "throughput_log_sd",
                 "step_time_ms_p50_ci_low", "step_time_ms_p50_ci_high"}


def standing(frame: pd.DataFrame) -> select.Selection:
    """The report's rows (``select.latest_runs``: one per identity), each aggregate's figures
    pooled from its repeats by ``sample``'s own code, so that the main tables (throughput,
    verdicts, memory) show the figure, n and interval the answer, compare and the sections
    show, even where the aggregate's logged median is stale (a repeat synced after it closed)."""
    selection = select.latest_runs(frame)
    kept = selection.runs
    aggregates = kept.index[kept["kind"] == "aggregate"]
    if not len(aggregates):
        return selection
    every = configs(frame)
    result_of = dict(zip(frame["run_id"], ident.column(frame, "fxtrack.result_id", None)))
    cols = [c for c in kept.columns if c.startswith("metrics.")
            and c[len("metrics."):] not in _OF_THE_GROUP]
    for i in aggregates:
        head = kept.loc[i].copy()
        head["result_id"] = result_of.get(head["run_id"])
        reps = every[every["repeat_of"] == head["result_id"]] if head["result_id"] else every[:0]
        if reps.empty:
            continue  # its repeats are not in the store: its own logged figures stand
        one = head.to_frame().T
        for col in cols:
            found = _pooled(head, one, reps, col, col[len("metrics."):], None)
            if found is None:
                continue
            kept.at[i, col] = found.point
            if col == "metrics.throughput_samples_per_s":
                kept.at[i, "repeats"] = found.n
                interval = found.interval()
                log_mean, log_sd = found.log[:2] if found.log else (math.nan, math.nan)
                low, high = interval or (math.nan, math.nan)
                for key, value in (("throughput_log_mean", log_mean), ("throughput_log_sd", log_sd),
                                   ("throughput_ci_low", low), ("throughput_ci_high", high),
                                   ("throughput_rel_ci", (high - low) / found.point)):
                    kept.loc[i, f"metrics.{key}"] = value
    return selection


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
