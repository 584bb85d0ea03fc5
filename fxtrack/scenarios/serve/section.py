"""The report's "Serving" section (scenario=serve, issue 32), per model: each framework's
highest rate under the SLOs with its ratio to the best, its goodput at the highest rate every
framework measured, and a chart of p99 latency against achieved throughput through the windows
of each framework's rate search (its child runs; a fixed-rate run is one window)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

from fxtrack.metrics import caveat_words
from fxtrack.report.select import by_model, frameworks, metric
from fxtrack.scenarios import of_section
from fxtrack.report.tables import Section, Table, fmt


@dataclasses.dataclass
class Window:
    """One served window of a framework: a probe of its search, or a fixed-rate run."""

    rate: Optional[float]  # requested requests/s (None: closed loop)
    throughput: Optional[float]
    e2e_p99: Optional[float]
    tpot_p99: Optional[float]
    goodput: Optional[float]
    attained: Optional[float]
    passed: bool


def _served(runs: pd.DataFrame) -> pd.DataFrame:
    if "scenario" not in runs or runs.empty:
        return runs.iloc[0:0]
    return runs[runs["scenario"].isin(of_section(__name__))]


def windows(frame: pd.DataFrame, run: pd.Series) -> list[Window]:
    """The windows behind a kept serve run: its rate-search probes (child runs tagged
    ``fxtrack.serve_probe``), else the run's own window."""
    rows = [run]
    if "tags.fxtrack.serve_probe" in frame:
        # its probes: its child runs, and a sweep's window at a common rate (sweep.py), a run
        # of its own that names the search's result id
        of = pd.Series(False, index=frame.index)
        if "tags.mlflow.parentRunId" in frame:
            of |= frame["tags.mlflow.parentRunId"] == run["run_id"]
        if {"tags.fxtrack.serve_probe_of", "tags.fxtrack.result_id"} <= set(frame.columns):
            own = frame.loc[frame["run_id"] == run["run_id"], "tags.fxtrack.result_id"]
            of |= frame["tags.fxtrack.serve_probe_of"].isin(own.dropna())
        children = frame[of & frame["tags.fxtrack.serve_probe"].notna()]
        if not children.empty:
            rows = [r for _, r in children.iterrows()]
    # scenario.sized_tail: a full window confirms a rate a small probe already served; the
    # larger window at a rate is the one the curve and the common rate read
    kept: dict[Optional[float], pd.Series] = {}
    for r in rows:
        rate = metric(r, "requested_rate_rps")
        if rate not in kept or (metric(r, "serve_requests") or 0) > (
                metric(kept[rate], "serve_requests") or 0):
            kept[rate] = r
    return [Window(metric(r, "requested_rate_rps"), metric(r, "request_throughput_rps"),
                   metric(r, "serve_e2e_ms_p99"), metric(r, "serve_tpot_ms_p99"),
                   metric(r, "goodput_rps"), metric(r, "slo_attained_fraction"),
                   str(r.get("tags.fxtrack.serve_probe", "pass")) in ("pass", "nan", "None"))
            for r in kept.values()]


def common_rate(by_framework: dict[str, list[Window]]) -> Optional[float]:
    """The highest requested rate every framework served within its SLOs (the searches' probes
    share a power-of-two grid; a sweep adds a window where none is shared), else the highest
    every one measured a window at, or None."""
    for served in (True, False):
        rates = [{w.rate for w in ws if w.rate is not None and (w.passed or not served)}
                 for ws in by_framework.values()]
        shared = set.intersection(*rates) if rates else set()
        if shared:
            return max(shared)
    return None


def tables(runs: pd.DataFrame, frame: Optional[pd.DataFrame] = None) -> list[Table]:
    """Per model: the max-rate table, and goodput at the common rate (two frameworks or more)."""
    frame = runs if frame is None else frame
    out = []
    served = _served(runs)
    # a framework's batching policies side by side in one table: the policy is its choice
    # (as the answer's serve block compares them), named in its row, not another table
    served = served.assign(_table=[_without_policy(v) for v in served[by_model(runs)]])
    for model, group in served.groupby("_table", sort=True):
        order = frameworks(group)
        group = group.iloc[sorted(range(len(group)),
                                  key=lambda i: order.index(group["framework"].iloc[i]))]
        rates = [metric(r, "max_rate_under_slo_rps") for _, r in group.iterrows()]
        best = max((r for r in rates if r), default=None)
        rows = []
        for (_, row), rate in zip(group.iterrows(), rates):
            ratio = f"{rate / best:.2f}x" if rate and best else "-"
            rows.append([_label(row), fmt(rate, 2), ratio,
                         fmt(metric(row, "lowest_failing_rate_rps"), 2),
                         fmt(metric(row, "serve_e2e_ms_p99")),
                         fmt(metric(row, "serve_tpot_ms_p99")),
                         fmt(metric(row, "goodput_rps"), 2),
                         fmt(metric(row, "request_throughput_rps"), 2)])
        out.append(Table(f"Serving: {model}",
                         ["framework", "max rate under SLO (req/s)", "vs best",
                          "lowest failing (req/s)", "p99 E2E ms", "p99 TPOT ms", "goodput (req/s)",
                          "achieved (req/s)"], rows,
                         ["latency and goodput are the reported window's (with rate=search: the "
                          "highest passing probe's)", "a probe fails when a p99 misses its SLO or "
                          "when requests are admitted >10% slower than they arrive (saturated), or "
                          "when more than 1% of its requests failed",
                          "static batching: a batch is prefilled and decoded together; "
                          "continuous: a request joins a free slot at the next decode step"]))
        by_fw = {_label(r): windows(frame, r) for _, r in group.iterrows()}
        rate = common_rate(by_fw) if len(by_fw) > 1 else None
        if len(by_fw) > 1:
            at = {fw: next(w for w in ws if w.rate == rate) for fw, ws in by_fw.items()} if rate else {}
            out.append(Table(
                f"Serving: {model}, goodput at a common rate"
                + (f" ({rate:g} req/s)" if rate else ""),
                ["framework", "goodput (req/s)", "SLO attained", "p99 E2E ms", "achieved (req/s)"],
                [[fw, fmt(w.goodput, 2), "-" if w.attained is None else f"{w.attained:.0%}",
                  fmt(w.e2e_p99), fmt(w.throughput, 2)] for fw, w in at.items()],
                ["the highest requested rate every framework served within its SLOs (else "
                 "the highest each measured a window at): the same offered load for each"
                 if rate else
                 "no rate was served by every framework (fixed rates differ, or a search "
                 "started off the shared grid): no common-rate figure"]))
    return out


def _without_policy(label: str) -> str:
    """``vit tiny [scenario.batching=static, scenario.rate=8]`` -> ``vit tiny [scenario.rate=8]``."""
    import re

    out = re.sub(r"scenario\.batching=[^,\]]*(, )?", "", str(label))
    return re.sub(r",? \[\]$|, \]", lambda m: "" if m.group(0).endswith("[]") else "]", out)


def _label(row: pd.Series) -> str:
    """The framework and, where the run says, its batching policy: a line and a row each."""
    marks = caveat_words("serve", lambda tag: str(row.get(f"caveat.{tag}")) == "true")
    policy = row.get("tags.fxtrack.serve_batching")
    if not isinstance(policy, str) or not policy:
        policy = row.get("identity.scenario.batching")
    policy = f" {policy}" if isinstance(policy, str) and policy not in ("", "-") else ""
    return f"{row['framework']}{policy}" + (f" ({', '.join(marks)})" if marks else "")


def charts(frame: pd.DataFrame, runs: pd.DataFrame, out: Path, histories: Callable) -> list:
    """Per model: p99 E2E (and for an LM p99 TPOT) against achieved throughput, one line per
    framework through its windows."""
    from fxtrack.report import charts as chart_module

    drawn = []
    for model, group in _served(runs).groupby(by_model(runs), sort=True):
        by_fw = {_label(r): windows(frame, r) for _, r in group.iterrows()}
        for key, words in (("e2e_p99", "p99 E2E latency (ms)"), ("tpot_p99", "p99 TPOT (ms)")):
            lines = {fw: [(w.throughput, getattr(w, key), w.passed) for w in ws
                          if w.throughput is not None and getattr(w, key) is not None]
                     for fw, ws in by_fw.items()}
            lines = {fw: points for fw, points in lines.items() if points}
            if not lines:
                continue
            name = key.split("_")[0]
            drawn.append(chart_module.latency_throughput_chart(
                lines, f"Serving: {model}, {words} against throughput", words,
                out / f"serve-{chart_module._slug(model)}-{name}.png",
                "One point per window (each probe of the rate search; a fixed-rate run is one "
                "point); filled: met every SLO and kept up, hollow: failed; lower and further "
                "right is better."))
    return drawn


def closing_table(jobs: list[dict], aggregates: list[dict]) -> str:
    """The sweep's serve jobs as a text table (empty when there are none): the highest rate
    under the SLOs with its ratio to the best, the bracket, why the search stopped, goodput and
    p99 latencies of the reported window."""
    served = [j for j in jobs if j.get("tags", {}).get("fxtrack.scenario") in of_section(__name__)
              and j.get("status") == "FINISHED"]
    if not served:
        return ""
    from fxtrack.report.render import text_table

    best = max((j["metrics"].get("max_rate_under_slo_rps") or 0.0 for j in served), default=0.0)
    rows, cold = [], []
    for j in served:
        m, t = j["metrics"], j["tags"]
        rate = m.get("max_rate_under_slo_rps")
        p99_note = " (few)" if t.get("fxtrack.serve_p99_undersized") == "true" else ""
        marks = caveat_words("serve", lambda tag: t.get(f"fxtrack.{tag}") == "true")
        name = j["name"] + (f" ({', '.join(marks)})" if marks else "")
        policy = t.get("fxtrack.serve_batching", "-")
        rows.append([name, policy, fmt(rate, 2), f"{rate / best:.2f}x" if rate and best else "-",
                     fmt(m.get("lowest_failing_rate_rps"), 2), t.get("fxtrack.serve_search_stop", "-"),
                     fmt(m.get("goodput_rps"), 2), fmt(m.get("serve_e2e_ms_p99")) + p99_note,
                     fmt(m.get("serve_tpot_ms_p99")), fmt(m.get("failed_requests"), 0),
                     fmt(m.get("serve_recompiles"), 0)])
        first = m.get("first_request_ms")
        cold.append([name, policy, fmt(m.get("load_s"), 2), fmt(m.get("compile_s"), 2),
                     fmt(None if first is None else first / 1e3, 2)])
    # two tables, not one wide one: tabulate's wrapping of a too-wide table parses "1,385.0"
    # as a number whatever disable_numparse says, and fails
    return "\n".join(["", text_table(Table(
        "Serving (max rate under the SLOs; the reported window's figures; (few): a p99 over "
        "fewer requests than MLPerf's early-stopping minimum):",
        ["run", "batching", "max rate req/s", "vs best", "lowest failing", "stopped by",
         "goodput req/s", "p99 E2E ms", "p99 TPOT ms", "failed", "recompiles"], rows)),
        text_table(Table("Serving cold start (before the warm window):",
                         ["run", "batching", "load s", "compile s", "first request s"], cold)),
        ""])


def section(runs: pd.DataFrame, frame: Optional[pd.DataFrame] = None) -> Optional[Section]:
    found = tables(runs, frame)
    return Section("Serving", found) if found else None
