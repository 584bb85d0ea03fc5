"""The levers' tables: "Deployment" (framework x runtime x quantisation: latency p50, speed-up
vs native, error, artefact MiB) and "Memory levers" (framework x parallel x memory: peak MiB per
device, throughput, both as ratios to the ddp/none run of the same config).

They read the raw ``search_runs`` frame, not the report's kept runs: a benchmark's
runtime / quantize / parallel / memory variants are separate cells here, and a combination that
has no path (``fxtrack.unsupported=true``, or an error saying "not supported by") is a cell that
says so, not a missing row. Each cell is the latest run of its full config, whatever its status.
"""

from __future__ import annotations

import textwrap
from typing import Callable, Optional

import pandas as pd

from fxtrack import scenarios

from fxtrack.report.identity import LEVERS
from fxtrack.report.select import _rank, framework_order
from fxtrack.report.tables import CONTENDED, FLAG, Section, Table, fmt, fmt_ms

BASE = ["framework", "model", "scenario", "precision", "devices", "hardware"]
KEY = BASE + list(LEVERS)
METRICS = ["latency_ms_p50", "step_time_ms_p50", "throughput_samples_per_s", "output_rel_err",
           "output_max_abs_err", "top1_agreement", "artefact_mib", "export_time_s",
           "peak_mem_device_mib", "peak_rss_mib", "state_mib_per_device"]


def _column(frame: pd.DataFrame, *names: str) -> pd.Series:
    """The first of ``names`` present (``tags.x`` / ``params.x``), else empty strings."""
    out = pd.Series([None] * len(frame), index=frame.index, dtype=object)
    for name in names:
        if name in frame:
            out = out.fillna(frame[name])
    return out


def cells(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per full config (BASE + levers): its latest benchmark run, finished or not."""
    runs = pd.DataFrame({k: _column(frame, f"tags.fxtrack.{k}", f"params.{k}") for k in BASE},
                        index=frame.index)
    for lever, default in LEVERS.items():
        runs[lever] = _column(frame, f"params.{lever}", f"tags.fxtrack.{lever}").fillna(default)
    runs["status"] = frame["status"]
    runs["start_time"] = frame["start_time"]
    runs["guard"] = _column(frame, "tags.fxtrack.guard").fillna("ok")
    runs["contended"] = _column(frame, "tags.fxtrack.contended") == "true"
    error = _column(frame, "tags.fxtrack.error").fillna("")
    runs["error"] = error
    runs["unsupported"] = ((_column(frame, "tags.fxtrack.unsupported") == "true")
                           | error.str.contains("not supported by", regex=False))
    for m in METRICS:
        runs[m] = pd.to_numeric(frame.get(f"metrics.{m}"), errors="coerce")
    runs = runs[runs["framework"].fillna("").astype(str).str.len() > 0]
    runs = runs[_column(frame, "tags.fxtrack.repeat_of").fillna("").loc[runs.index] == ""]
    runs = runs.sort_values("start_time", kind="stable").drop_duplicates(KEY, keep="last")
    order = framework_order()
    return runs.sort_values(["model", "framework"] + list(LEVERS), kind="stable",
                            key=lambda c: c.map(lambda v: _rank(v, order))
                            if c.name == "framework" else c)


def _num(value) -> Optional[float]:
    return None if value is None or pd.isna(value) else float(value)


def _state(row: pd.Series) -> Optional[str]:
    """What a cell says instead of figures: not supported (and why, briefly), or failed."""
    if row["unsupported"]:  # "NotSupported: runtime=tflite is not supported by torch 2.13: ..."
        error = str(row["error"])
        start = error.find("not supported by")  # up to the reason: "... by jax2onnx 0.17.1"
        return error[start:].split(": ")[0] if start >= 0 else "not supported"
    if row["status"] != "FINISHED":
        # shortened at a word, marked so (the whole error is the run's fxtrack.error tag)
        return "FAILED: " + textwrap.shorten(str(row["error"]), 90, placeholder=" ...")
    return None


def _ratio(value: Optional[float], base: Optional[float]) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}x"


def _baseline(runs: pd.DataFrame, row: pd.Series, levers: list[str]) -> Optional[pd.Series]:
    """The finished default-lever run of ``row``'s config (same BASE, other levers equal)."""
    same = runs
    for col in BASE + [lv for lv in LEVERS if lv not in levers]:
        same = same[same[col] == row[col]]
    for lv in levers:
        same = same[same[lv] == LEVERS[lv]]
    same = same[same["status"] == "FINISHED"]
    return None if same.empty else same.iloc[-1]


def deployment(frame: pd.DataFrame) -> list[Table]:
    """Inference runs that used a runtime or quantisation, beside their native fp32 baseline."""
    runs = cells(frame)
    runs = runs[runs["scenario"].isin(scenarios.where(deploys=True))]
    if not ((runs["runtime"] != "native") | (runs["quantize"] != "none")).any():
        return []
    tables = []
    for (precision, devices, hardware), group in runs.groupby(["precision", "devices", "hardware"],
                                                              sort=False):
        rows = []
        for _, row in group.iterrows():
            label = [row["model"], row["framework"], row["runtime"], row["quantize"]]
            state = _state(row)
            if state:
                rows.append(label + [state, "", "", "", ""])
                continue
            latency = _num(row["latency_ms_p50"]) or _num(row["step_time_ms_p50"])
            base = _baseline(group, row, ["runtime", "quantize"])
            base_latency = None if base is None else (_num(base["latency_ms_p50"])
                                                      or _num(base["step_time_ms_p50"]))
            speedup = "-" if latency is None or not base_latency else f"{base_latency / latency:.2f}x"
            err = _num(row["output_rel_err"])
            top1 = _num(row["top1_agreement"])
            flag = (FLAG if row["guard"] != "ok" else "") + (CONTENDED if row["contended"] else "")
            rows.append(label + [fmt_ms(latency) + flag, speedup,
                                 "-" if err is None else f"{err:.1e}",
                                 "-" if top1 is None else f"{top1:.0%}",
                                 fmt(_num(row["artefact_mib"]))])
        tables.append(Table(
            f"inference, {precision}, x{devices}, {hardware}",
            ["model", "framework", "runtime", "quantize", "latency p50 ms", "speed-up vs native",
             "rel. error", "top-1 agree", "artefact MiB"], rows,
            ["speed-up: the native/none run's p50 latency over this one's (same framework, "
             "model, batch); rel. error: max |out - native| / max |native| on the same batch",
             f"{FLAG}: the run failed its correctness guard (error over the bound); "
             f"{CONTENDED}: other processes took the cores during its timed window"]))
    return tables


def memory(frame: pd.DataFrame) -> list[Table]:
    """Training runs with parallel / memory levers, as ratios to their ddp/none run."""
    runs = cells(frame)
    runs = runs[runs["scenario"].isin(["train", "pipeline"])]
    if not ((runs["parallel"] != "ddp") | (runs["memory"] != "none")).any():
        return []
    tables = []
    for (precision, hardware), group in runs.groupby(["precision", "hardware"], sort=False):
        rows = []
        for _, row in group.iterrows():
            label = [row["model"], row["framework"], str(row["devices"]), row["parallel"],
                     row["memory"]]
            state = _state(row)
            if state:
                rows.append(label + [state, "", "", "", "", ""])
                continue
            base = _baseline(group, row, ["parallel", "memory"])
            flag = (FLAG if row["guard"] != "ok" else "") + (CONTENDED if row["contended"] else "")
            peak = _with_ratio(row, base, _peak)
            rows.append(label + [peak[0] + flag, peak[1], *_with_ratio(row, base, _held),
                                 *_with_ratio(row, base, _throughput)])
        tables.append(Table(
            f"train, {precision}, {hardware}",
            ["model", "framework", "devices", "parallel", "memory", "peak MiB per device",
             "peak ratio", "state MiB per device", "state ratio", "samples/s",
             "throughput ratio"], rows,
            ["peak per device: the framework's device peak where it has one (GPU), else the "
             "largest worker process's peak RSS (CPU: one process per rank in torch; JAX and "
             "TensorFlow hold every CPU device in one process, so there RSS is the whole job's)",
             "state per device: parameters, buffers and optimiser state on the fullest device, "
             "counted from the arrays it holds (state_mib_per_device; what parallel=fsdp shards)",
             "ratios: to the ddp/none run of the same framework, model, devices and batch",
             f"{FLAG}: failed its correctness guard; {CONTENDED}: measured on busy cores"]))
    return tables


def _peak(row: pd.Series) -> Optional[float]:
    return _num(row["peak_mem_device_mib"]) or _num(row["peak_rss_mib"])


def _held(row: pd.Series) -> Optional[float]:
    return _num(row["state_mib_per_device"])


def _throughput(row: pd.Series) -> Optional[float]:
    return _num(row["throughput_samples_per_s"])


def _with_ratio(row: pd.Series, base: Optional[pd.Series],
                figure: Callable[[pd.Series], Optional[float]]) -> list[str]:
    """[the row's figure, its ratio to the baseline run's] as table cells."""
    value = figure(row)
    return [fmt(value), _ratio(value, None if base is None else figure(base))]


def ratios(frame: pd.DataFrame) -> pd.DataFrame:
    """``memory_ratio_vs_baseline`` / ``throughput_ratio_vs_baseline`` per run_id-less cell,
    for callers that want the numbers rather than the table (e.g. a sweep's closing note)."""
    runs = cells(frame)
    out = []
    for _, row in runs[(runs["parallel"] != "ddp") | (runs["memory"] != "none")].iterrows():
        base = _baseline(runs, row, ["parallel", "memory"])
        if base is None or row["status"] != "FINISHED":
            continue
        peak, bpeak = _peak(row), _peak(base)
        held, bheld = _held(row), _held(base)
        thr, bthr = _num(row["throughput_samples_per_s"]), _num(base["throughput_samples_per_s"])
        out.append({**{k: row[k] for k in KEY},
                    "memory_ratio_vs_baseline": peak / bpeak if peak and bpeak else None,
                    "state_ratio_vs_baseline": held / bheld if held and bheld else None,
                    "throughput_ratio_vs_baseline": thr / bthr if thr and bthr else None})
    return pd.DataFrame(out)


def sections(frame: pd.DataFrame) -> list[Section]:
    """The two sections, where their runs exist (none: an empty list)."""
    built = [Section("Deployment", deployment(frame),
                     "Inference through deployment runtimes and dynamic int8, checked against "
                     "the native model on the same batch."),
             Section("Memory levers", memory(frame),
                     "Sharded training (parallel=fsdp) and activation checkpointing "
                     "(memory=checkpoint) against data parallelism without them.")]
    return [s for s in built if s.tables]
