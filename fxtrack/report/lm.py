"""The language-model tables: the decoder LMs' runs (model=llama, llama_8b, and a user's model
run with ``model.kind=lm``, tagged ``fxtrack.model_kind=lm``) with what LM people
read side by side: tokens/s, MFU and peak memory for training (and inference), and for
scenario=generate the time to the first token, the per-token decode latency, decode tokens/s
and the KV cache's size. One table per (scenario, precision, devices, hardware) group, a row per
model and framework, the same runs the other tables keep (select.latest_runs).

A repeated config's figure is its repeats' median with the 95% interval of their geometric mean
(report.samples, as fxtrack compare reads it: from the repeats where they are in the store,
else from the interval its aggregate logged).
"""

from __future__ import annotations

import math

from typing import Callable, Optional

import pandas as pd

from fxtrack import architectures
from fxtrack.report import samples
from fxtrack.report.select import metric
from fxtrack.report.tables import CONTENDED, FLAG, Section, Table, fmt, fmt_ms, group_title, groups



def lm_models() -> tuple[str, ...]:
    """fxtrack's own decoder LMs (a user's LM is told by its ``model_kind`` tag)."""
    return architectures.models_where(lambda family: family.generates)


MEMORY = "peak memory MiB"  # peak_mem_device_mib where a device counter exists, else peak_rss_mib


def _pct(value: float) -> str:
    return f"{value:.1%}"


# scenario -> its columns: (metric key, header, formatter); other scenarios read "train"'s.
COLUMNS: dict[str, list[tuple[str, str, Callable[[float], str]]]] = {
    "train": [("tokens_per_s", "tokens/s", fmt), ("mfu", "MFU", _pct), ("", MEMORY, fmt)],
    "generate": [("tokens_per_s", "tokens/s", fmt), ("ttft_ms_p50", "TTFT p50 ms", fmt_ms),
                 ("decode_ms_per_token_p50", "decode ms/token p50", fmt_ms),
                 ("decode_tokens_per_s", "decode tokens/s", fmt),
                 ("kv_cache_mib", "KV cache MiB", lambda v: fmt(v, 2)), ("", MEMORY, fmt)],
}
NOTES = {
    "train": ["tokens/s = sequences/s x model.seq_len; MFU = achieved model FLOP/s / peak "
              "(6 N T + 12 L H T^2 per sequence, docs/language-models.md)"],
    "generate": ["tokens/s = generations/s x scenario.new_tokens (prefill included); TTFT: the "
                 "prompt's prefill to the first token; decode ms/token: one cached step; "
                 "decode tokens/s = batch x (new_tokens - 1) / the decode steps' time"],
}
CUSTOM_NOTE = ("model=custom (model.kind=lm): tokens/s = sequences/s x the length of its first "
               "input along model.seq_axis (fxtrack.seq_len); MFU from the framework's own FLOP "
               "counter (fxtrack.flops_source)")
COMMON_NOTES = [
    "with repeats: the median [95% interval of the geometric mean over the repeats]",
    "peak memory: the device's peak (peak_mem_device_mib), else the worker's resident peak "
    "(peak_rss_mib, marked RSS)",
    f"{FLAG} = failed the correctness guard; {CONTENDED} = contended (other processes took > 10% "
    "of the cores while it ran)",
]


def _memory_key(row: pd.Series) -> tuple[str, str]:
    if metric(row, "peak_mem_device_mib") is not None:
        return "peak_mem_device_mib", ""
    return "peak_rss_mib", " RSS"


def cell(row: pd.Series, configs: pd.DataFrame, key: str,
         formatter: Callable[[float], str]) -> str:
    """``row``'s figure of ``key``: its repeats' median and interval where it has them, else
    the run's own value; ``-`` where it was not logged."""
    mine = configs[configs["run_id"] == row["run_id"]] if len(configs) else configs
    found = samples.sample(mine, configs, key) if len(mine) else None
    if found is None:  # e.g. a run that failed its guard (configs leaves those out)
        value = metric(row, key)
        return "-" if value is None else formatter(value)
    interval = found.interval()
    if interval is not None and math.isclose(*interval, rel_tol=1e-9):
        interval = (found.point, found.point)  # equal repeats: no float noise past the median
    spread = "" if interval is None else f" [{formatter(interval[0])}, {formatter(interval[1])}]"
    return formatter(found.point) + spread


def tables(frame: pd.DataFrame, runs: pd.DataFrame) -> list[Table]:
    """The LM tables of the kept ``runs``; ``frame``: every run read (the repeats' figures)."""
    user_lm = (runs["model_kind"] == "lm") if "model_kind" in runs else False
    lm = runs[runs["model"].isin(lm_models()) | user_lm]
    if lm.empty:
        return []
    configs = samples.configs(frame)
    out = []
    for key, group in groups(lm):
        scenario = key[0]
        columns = COLUMNS.get(scenario, COLUMNS["train"])
        rows = []
        for _, row in group.sort_values(["model"], kind="stable").iterrows():
            marks = (f" {FLAG}" if row["check"] != "ok" else "") + (
                f" {CONTENDED}" if str(row.get("contended")) == "true" else "")
            cells = []
            for metric_key, _, formatter in columns:
                if metric_key:
                    cells.append(cell(row, configs, metric_key, formatter))
                else:
                    memory_key, suffix = _memory_key(row)
                    text = cell(row, configs, memory_key, lambda v: fmt(v, 0))
                    cells.append(text + (suffix if text != "-" else ""))
            rows.append([row["model"], f"{row['framework']}{marks}", *cells])
        notes = NOTES.get(scenario, NOTES["train"]) + COMMON_NOTES
        if (group["model"] == architectures.CUSTOM).any():
            notes = [*notes[:1], CUSTOM_NOTE, *notes[1:]]
        out.append(Table(f"Language models: {group_title(key)}",
                         ["model", "framework", *[c[1] for c in columns]], rows, notes))
    return out


def section(frame: pd.DataFrame, runs: pd.DataFrame) -> Optional[Section]:
    """The report's "Language models" section, or None when no LM run is kept."""
    found = tables(frame, runs)
    return Section("Language models", found) if found else None
