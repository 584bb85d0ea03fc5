"""The report's "Serving" section (scenario=serve, issue 32): per model, each framework's highest
rate under the SLOs with its ratio to the best, and its latency and goodput at the rate reported.
The chart of p99 latency against achieved throughput is not drawn yet."""

from __future__ import annotations

import math
from typing import Optional

import pandas as pd

from fxtrack.report.tables import Section, Table, fmt


def _figure(row: pd.Series, key: str) -> Optional[float]:
    value = row.get(key)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def tables(runs: pd.DataFrame) -> list[Table]:
    """One table per model of the kept scenario=serve runs."""
    if "scenario" not in runs or runs.empty:
        return []
    served = runs[runs["scenario"] == "serve"]
    out = []
    for model, group in served.groupby("model", sort=True):
        group = group.sort_values("framework", kind="stable")
        rates = [_figure(r, "max_rate_under_slo_rps") for _, r in group.iterrows()]
        best = max((r for r in rates if r), default=None)
        rows = []
        for (_, row), rate in zip(group.iterrows(), rates):
            ratio = f"{rate / best:.2f}x" if rate and best else "-"
            contended = " (contended)" if str(row.get("contended")) == "true" else ""
            rows.append([f"{row['framework']}{contended}", fmt(rate, 2), ratio,
                         fmt(_figure(row, "lowest_failing_rate_rps"), 2),
                         fmt(_figure(row, "serve_e2e_ms_p99")),
                         fmt(_figure(row, "serve_tpot_ms_p99")),
                         fmt(_figure(row, "goodput_rps"), 2),
                         fmt(_figure(row, "request_throughput_rps"), 2)])
        out.append(Table(f"Serving: {model}",
                         ["framework", "max rate under SLO (req/s)", "vs best",
                          "lowest failing (req/s)", "p99 E2E ms", "p99 TPOT ms", "goodput (req/s)",
                          "achieved (req/s)"], rows,
                         ["latency and goodput are the reported window's (with rate=search: the "
                          "highest passing probe's)", "static batching: a batch is prefilled and "
                          "decoded together"]))
    return out


def section(runs: pd.DataFrame) -> Optional[Section]:
    found = tables(runs)
    return Section("Serving", found) if found else None
