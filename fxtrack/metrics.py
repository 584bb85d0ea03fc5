"""The metric registry: per metric (or name pattern for a family of keys) its unit, which way it
improves and a one-line meaning. Pure data, no framework or mlflow import, so report, tracking and
the worker can all read it. ``system/...`` metrics are MLflow's and not listed."""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    pattern: str          # a regex searched in the key (anchored where the key is exact)
    unit: str
    direction: str        # "lower" | "higher" | "neither"
    meaning: str


# Order matters: the first matching entry wins (lower-is-better keys are checked first, as the
# report's regexes did before this table replaced them).
METRICS: tuple[Metric, ...] = (
    Metric(r"^step_time_ms", "ms", "lower", "wall time of one training or inference step"),
    Metric(r"^latency_ms", "ms", "lower", "request latency"),
    Metric(r"^ttft_ms", "ms", "lower", "time to first token"),
    Metric(r"^decode_ms_per_token", "ms", "lower", "decode time per generated token"),
    Metric(r"^compile_time_s", "s", "lower", "time spent compiling"),
    Metric(r"^first_step_time_s", "s", "lower", "wall time of the first step"),
    Metric(r"^peak_mem", "MiB", "lower", "peak accelerator memory"),
    Metric(r"^peak_rss", "MiB", "lower", "peak host resident memory"),
    Metric(r"^state_mib", "MiB", "lower", "size of the training state"),
    Metric(r"^checkpoint_", "s or MiB", "lower", "checkpoint save/restore time and size"),
    Metric(r"^export_", "s or MiB", "lower", "export time and size"),
    Metric(r"^artefact_mib", "MiB", "lower", "size of an exported artefact"),
    Metric(r"^energy_j", "J", "lower", "energy used"),
    Metric(r"^power_w", "W", "lower", "power drawn"),
    Metric(r"^cost_per_", "USD", "lower", "cost per unit of work"),
    Metric(r"^output_.*err", "1", "lower", "output error against the reference"),
    Metric(r"^code_", "lines", "lower", "size of the code a run needed"),
    Metric(r"^host_other_cpu", "%", "lower", "CPU taken by other host processes"),
    Metric(r"^step_time_cv", "1", "lower", "coefficient of variation of step time"),
    Metric(r"^memory_ratio", "1", "lower", "measured over estimated memory"),
    Metric(r"_per_s$", "1/s", "higher", "a rate: samples, tokens or requests per second"),
    Metric(r"^throughput", "1/s", "higher", "throughput"),
    Metric(r"^mfu$", "1", "higher", "model FLOP utilisation"),
    Metric(r"^achieved_tflops", "TFLOP/s", "higher", "achieved TFLOP/s"),
    Metric(r"^scaling_efficiency", "1", "higher", "scaling efficiency over one device"),
    Metric(r"^speedup_x", "x", "higher", "speed-up over the baseline"),
    Metric(r"^top1_agreement", "1", "higher", "top-1 agreement with the reference"),
    Metric(r"^resident_", "1", "higher", "share kept resident"),
)
_COMPILED = tuple((re.compile(m.pattern), m) for m in METRICS)


def lookup(key: str) -> Metric | None:
    """The registry entry for a metric key, or None for a key fxtrack does not know."""
    for rx, metric in _COMPILED:
        if rx.search(key):
            return metric
    return None
