"""The report's cost table: what a million samples (or tokens) cost on each kept run, where the
run was given ``hardware.price_per_hour`` (fxtrack/measure/cost.py computes the figures)."""

from __future__ import annotations

import pandas as pd

from fxtrack.report.tables import Section, Table, _long, fmt


def _money(value):
    return fmt(value, 4 if value is not None and value < 1 else 2)


def table(runs: pd.DataFrame) -> list[Table]:
    """One row per kept run that logged a cost; none when no run did."""
    return _long(runs, "Cost", {
        "throughput_samples_per_s": ("samples/s", fmt),
        "cost_per_1m_samples": ("cost / 1M samples", _money),
        "cost_per_1m_tokens": ("cost / 1M tokens", _money)},
        ["cost = hardware.price_per_hour / 3600 x devices x nodes x 1e6 / throughput, in the "
         "currency the price was given in"])


def section(runs: pd.DataFrame) -> list[Section]:
    """The report's cost section, if any kept run has a cost."""
    found = table(runs)
    return [Section("Cost", found)] if found else []
