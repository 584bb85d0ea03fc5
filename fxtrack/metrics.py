"""The metric registry: every metric key fxtrack logs, with its unit, which way it improves, a
one-line meaning and the scenarios that log it. Pure data, no framework or mlflow import, so the
report, ``compare``, ``claims`` and the answer page read direction and unit from one place.
The keys several scenarios log are here (``SHARED``); a scenario's own are declared in its folder
(``Scenario.own_metrics``); ``registered()`` is both.

Names are written as ``docs/contract.md``'s Metrics tables write them: ``{a|b}`` is one of the
alternatives, ``{N}`` a device count. ``tests/test_docs.py`` checks the registry against those
tables and against every key the code writes, both ways, units included. MLflow's ``system/...``
series are not metrics of fxtrack's and are not listed.
"""
from __future__ import annotations

import functools
import re
from typing import Callable
from dataclasses import dataclass

LOWER, HIGHER, NEITHER = "lower", "higher", "neither"  # NEITHER: a figure, not a merit

# The scenarios each group of keys is logged by (the contract's Metrics subsections).
TIMED = ("train", "inference", "generate", "scaling", "pipeline")
WINDOW = TIMED + ("serve",)  # measured windows: the host load, system metrics, NVML
AGGREGATE = ("aggregate",)
CONVERGE = ("converge",)  # an aggregate run of repeats=N, any scenario
# every scenario's timed work carries its host load (converge: over its training steps)
LOADED = WINDOW + CONVERGE
# MLPerf Inference's quality bar: a served model keeps at least 99% of its fp32 reference's
# accuracy (model.from_run's accuracy_vs_fp32; below it the run is tagged serving_quality=lost)
SERVING_QUALITY = 0.99


@dataclass(frozen=True)
class Metric:
    name: str  # the contract's notation: step_time_ms_{p50|p90}, speedup_x{N}
    unit: str
    direction: str  # LOWER | HIGHER | NEITHER
    meaning: str
    scenarios: tuple[str, ...] = ()  # a scenario's own (its spec's own_metrics): filled in

    @functools.cached_property
    def pattern(self) -> re.Pattern:
        """The keys this entry names, as a regex matched against a whole key."""
        return re.compile(notation(self.name))

    @property
    def lower_is_better(self) -> bool:
        return self.direction == LOWER


def notation(name: str) -> str:
    """The regex (source) of a name in the contract's notation: ``{a|b}`` one of the
    alternatives, ``{N}`` a number, the rest literal."""
    out, pos = "", 0
    for m in re.finditer(r"\{([^{}]+)\}", name):
        out += re.escape(name[pos:m.start()])
        inner = m.group(1)
        out += r"\d+" if inner == "N" else "(?:" + "|".join(map(re.escape, inner.split("|"))) + ")"
        pos = m.end()
    return out + re.escape(name[pos:])


def _m(name: str, unit: str, direction: str, meaning: str,
       scenarios: tuple[str, ...] = TIMED) -> Metric:
    return Metric(name, unit, direction, meaning, scenarios)


_STEP = "step_time_ms_{p50|p90|p99|mean|std}"
SHARED: tuple[Metric, ...] = (
    # every timed run
    _m("throughput_samples_per_s", "samples/s", HIGHER,
       "global samples in the timed window / its wall time"),
    _m(_STEP, "ms", LOWER, "per-step wall time over the timed steps"),
    _m("step_time_cv", "ratio", LOWER, "step-time standard deviation / mean"),
    _m("first_step_time_s", "s", LOWER, "the first step, compilation included"),
    _m("param_count", "parameters", NEITHER, "trainable parameters of the built model",
       TIMED + CONVERGE),
    _m("compile_time_s", "s", LOWER, "first step minus the median timed step", TIMED + CONVERGE),
    _m("flops_per_sample", "FLOP", NEITHER, "model FLOPs per sample"),
    _m("tokens_per_s", "tokens/s", HIGHER, "language models: samples/s x tokens per sample"),
    _m("achieved_tflops", "TFLOP/s", HIGHER, "flops_per_sample x throughput"),
    _m("peak_rss_mib", "MiB", LOWER, "peak resident memory of the worker's largest process"),
    _m("peak_mem_device_mib", "MiB", LOWER, "the framework's own peak device memory", WINDOW),
    _m("peak_mem_device_reserved_mib", "MiB", LOWER, "GPU: the allocator pool's peak", WINDOW),
    _m("peak_mem_nvml_mib", "MiB", LOWER, "GPU: NVML's per-process peak", WINDOW),
    _m("energy_j_per_sample", "J/sample", LOWER, "GPU: NVML energy per sample", WINDOW),
    _m("power_w_mean", "W", LOWER, "GPU: mean power over the timed window", WINDOW),
    _m("host_other_cpu_frac", "fraction 0..1", LOWER,
       "CPU other processes took on the run's cores in the window", LOADED),
    _m("host_other_cpu_frac_before", "fraction 0..1", LOWER, "the same, just before the window", LOADED),
    _m("host_steal_frac", "fraction 0..1", LOWER, "hypervisor steal time in the window", LOADED),
    _m("host_loadavg_1m", "processes", LOWER, "1-minute load average at the window's end", LOADED),
    _m("framework_matmul_tflops", "TFLOP/s", HIGHER, "this framework's large-matmul rate"),
    _m("own_matmul_share", "fraction", HIGHER,
       "achieved_tflops / (devices x framework_matmul_tflops)"),
    _m("peak_tflops", "TFLOP/s", NEITHER, "the device's peak MFU is measured against"),
    _m("mfu", "fraction", HIGHER, "achieved_tflops / (devices x peak_tflops)"),
    _m("cost_per_1m_samples", "currency", LOWER, "price of a million samples"),
    _m("cost_per_1m_tokens", "currency", LOWER, "price of a million tokens"),
    _m("code_{sloc|lloc|cc}", "lines / lines / complexity", LOWER,
       "size and complexity of the framework's implementation"),
    _m("code_{sloc|lloc|cc}_{model|train|data|devices|checkpoint}", "as above", LOWER,
       "the same per API dimension"),
    # scenario=train (and scaling children)
    _m("loss_first", "loss", NEITHER, "the first step's loss", ("train", "scaling") + CONVERGE),
    _m("loss_last", "loss", NEITHER, "the last step's loss", ("train", "scaling") + CONVERGE),
    _m("state_mib_per_device", "MiB", LOWER, "training state held by the fullest device",
       ("train", "scaling")),
    # scenario=inference
    _m("eval_accuracy", "fraction", HIGHER,
       "model.from_run: held-out accuracy of the served model", ("inference", "serve")),
    _m("accuracy_vs_fp32", "ratio", HIGHER,
       "model.from_run: eval_accuracy / the native fp32 model's in the same job",
       ("inference", "serve")),
    # aggregate runs
    _m("repeats", "count", NEITHER, "how many repeats the figures stand on", AGGREGATE),
    _m("throughput_ci_{low|high}", "samples/s", HIGHER, "95% interval of the throughput",
       AGGREGATE),
    _m("throughput_rel_ci", "fraction", LOWER, "interval width / median", AGGREGATE),
    _m("throughput_log_mean", "log(samples/s)", HIGHER, "mean log throughput", AGGREGATE),
    _m("throughput_log_sd", "log(samples/s)", LOWER, "sd of log throughput", AGGREGATE),
    _m("step_time_ms_p50_ci_{low|high}", "ms", LOWER, "95% interval of step_time_ms_p50",
       AGGREGATE),
)
_RESIDENT = "resident_"


def declare(scenario: str, own: tuple[Metric, ...]) -> None:
    """A registered scenario's own metrics (``fxtrack.scenarios.registry.register`` calls this;
    ``()`` withdraws them), each filed under its name."""
    import dataclasses

    if own:
        _OWN[scenario] = tuple(dataclasses.replace(m, scenarios=(scenario,)) for m in own)
    else:
        _OWN.pop(scenario, None)
    _REGISTERED.clear()


def registered() -> tuple[Metric, ...]:
    """Every metric: the shared ones, then each registered scenario's own (the registry holds
    them once ``fxtrack.scenarios`` is imported, as every caller of this module does)."""
    if not _REGISTERED:
        _REGISTERED["metrics"] = SHARED + tuple(m for own in _OWN.values() for m in own)
    return _REGISTERED["metrics"]


_OWN: dict[str, tuple[Metric, ...]] = {}  # scenario -> its own metrics (declare)
_REGISTERED: dict[str, tuple[Metric, ...]] = {}  # registered()'s answer, until the next declare


def lookup(key: str) -> Metric | None:
    """The registry entry naming a metric key, or None for a key fxtrack does not log. A
    resident window's figure (``resident_step_time_ms_p50``) reads as its unprefixed key."""
    for metric in registered():
        if metric.pattern.fullmatch(key):
            if metric.name.startswith(_RESIDENT + "{"):
                return lookup(key[len(_RESIDENT):])
            return metric
    return None


@dataclass(frozen=True)
class Caveat:
    """A run's tag (``fxtrack.<tag>`` = ``true``) that qualifies its figures: shown beside each
    figure that stands on such a run (an aggregate: on any of its repeats), wherever it appears."""

    tag: str
    words: str  # beside the figure: "contended"
    meaning: str  # a page's note: what it means, what to do
    scenarios: tuple[str, ...] = ()  # the scenarios whose figures it qualifies; (): every one


CAVEATS = (
    Caveat("contended", "contended", "other processes shared the cores (or the GPU) while it "
           "was measured; re-measure on a quiet machine"),
    Caveat("noisy", "noisy", "its repeats spread widely (the interval is wide); more repeats or "
           "a quieter machine narrow it"),
    Caveat("serve_rate_short", "rate short", "the load generator delivered less than the rate "
           "asked: the rate it reached is the figure's real load", ("serve",)),
    Caveat("serve_p99_undersized", "p99 from few requests", "too few requests for a p99 by "
           "MLPerf's early-stopping rule: a longer window sizes the tail", ("serve",)),
    Caveat("serve_outputs_mismatch", "wrong outputs", "some requests were served other tokens "
           "than their prompt decoded alone (mismatched_requests): batching changed the answers, "
           "so the speed is not of a correct server", ("serve",)),
)


def caveats(scenario: str) -> tuple[Caveat, ...]:
    """The caveats declared for ``scenario``'s figures."""
    return tuple(c for c in CAVEATS if not c.scenarios or scenario in c.scenarios)


def caveat_words(scenario: str, tagged: "Callable[[str], bool]") -> list[str]:
    """The words of each caveat declared for ``scenario`` whose tag ``tagged`` says is set:
    what every place that shows a figure writes beside it."""
    return [c.words for c in caveats(scenario) if tagged(c.tag)]
