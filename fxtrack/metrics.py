"""The metric registry: every metric key fxtrack logs, with its unit, which way it improves, a
one-line meaning and the scenarios that log it. Pure data, no framework or mlflow import, so the
report, ``compare``, ``claims`` and the answer page read direction and unit from one place.

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
    scenarios: tuple[str, ...]

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
METRICS: tuple[Metric, ...] = (
    # every timed run
    _m("throughput_samples_per_s", "samples/s", HIGHER,
       "global samples in the timed window / its wall time"),
    _m(_STEP, "ms", LOWER, "per-step wall time over the timed steps"),
    _m("step_time_cv", "ratio", LOWER, "step-time standard deviation / mean"),
    _m("first_step_time_s", "s", LOWER, "the first step, compilation included"),
    _m("compile_time_s", "s", LOWER, "first step minus the median timed step", TIMED + CONVERGE),
    _m("param_count", "parameters", NEITHER, "trainable parameters of the built model",
       TIMED + CONVERGE),
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
    _m("profile_{matmul|attention|norm_elementwise|optimizer|overhead}_ms", "ms", NEITHER,
       "scenario.profile_steps: one profiled step's time in that category (its framework's own "
       "profiler)", ("train",)),
    _m("profile_step_ms", "ms", NEITHER, "scenario.profile_steps: the profiled step's wall span",
       ("train",)),
    _m("profile_timed_step_ms", "ms", NEITHER, "scenario.profile_steps: the median profiled "
       "step as fxtrack's timer saw it, around the step annotation", ("train",)),
    _m("profile_unprofiled_step_ms", "ms", NEITHER, "scenario.profile_steps: the median "
       "unprofiled step timed just before and just after the profiled ones", ("train",)),
    # scenario=converge
    _m("time_to_target_s", "s", LOWER, "training time to the first evaluation meeting the target",
       CONVERGE),
    _m("steps_to_target", "steps", LOWER, "optimiser steps to that evaluation", CONVERGE),
    _m("samples_to_target", "samples", LOWER, "training samples to that evaluation", CONVERGE),
    _m("reached_target", "0 or 1", HIGHER, "1 when the target was met within the budget",
       CONVERGE),
    _m("eval_time_s", "s", NEITHER, "time spent evaluating, kept out of the training time",
       CONVERGE),
    _m("train_time_s", "s", NEITHER, "training time of the whole run, compilation excluded",
       CONVERGE),
    _m("steps_trained", "steps", NEITHER, "optimiser steps the run took", CONVERGE),
    _m("loss_divergence_max", "ratio", LOWER,
       "largest relative gap of the first training losses from the first framework's", CONVERGE),
    _m("final_eval_vs_fp32", "metric units", HIGHER,
       "a lever's final metric against its framework's fp32 run, positive is better", CONVERGE),
    _m("time_to_target_x_fp32", "ratio", LOWER,
       "a lever's time to target / its framework's fp32 run's", CONVERGE),
    _m("final_eval_accuracy", "fraction", HIGHER, "the last evaluation's accuracy", CONVERGE),
    _m("final_eval_loss", "nats", LOWER, "the last evaluation's cross-entropy", CONVERGE),
    _m("final_eval_bits_per_byte", "bits/byte", LOWER, "the last evaluation's bits per byte",
       CONVERGE),
    # scenario=inference
    _m("latency_ms_{p50|p90|p99}", "ms", LOWER, "one batch's forward time", ("inference",)),
    _m("latency_percentile_queries", "count", NEITHER,
       "the timed batches every latency percentile is taken over", ("inference",)),
    _m("output_max_abs_err", "logit units", LOWER, "largest difference from native fp32",
       ("inference",)),
    _m("output_rel_err", "ratio", LOWER, "that difference / the largest native logit",
       ("inference",)),
    _m("top1_agreement", "fraction", HIGHER, "share of samples whose top-1 matches native",
       ("inference",)),
    _m("artefact_mib", "MiB", LOWER, "the exported file the runtime serves", ("inference",)),
    _m("export_time_s", "s", LOWER, "export, quantisation and load of the served model",
       ("inference",)),
    _m("eval_accuracy", "fraction", HIGHER,
       "model.from_run: held-out accuracy of the served model", ("inference", "serve")),
    _m("accuracy_vs_fp32", "ratio", HIGHER,
       "model.from_run: eval_accuracy / the native fp32 model's in the same job",
       ("inference", "serve")),
    # scenario=generate
    _m("ttft_ms_{p50|p90}", "ms", LOWER, "time to the first token", ("generate",)),
    _m("decode_ms_per_token_{p50|p90}", "ms", LOWER, "one decode step through the cache",
       ("generate",)),
    _m("decode_tokens_per_s", "tokens/s", HIGHER, "tokens decoded per second", ("generate",)),
    _m("kv_cache_mib", "MiB", LOWER, "the KV cache's bytes", ("generate",)),
    # scenario=serve
    _m("serve_e2e_ms_{p50|p90|p99}", "ms", LOWER, "arrival to last token", ("serve",)),
    _m("serve_ttft_ms_{p50|p90|p99}", "ms", LOWER, "arrival to first token", ("serve",)),
    _m("serve_tpot_ms_{p50|p90|p99}", "ms", LOWER, "time per output token after the first",
       ("serve",)),
    _m("serve_itl_ms_{p50|p90|p99}", "ms", LOWER, "gap between consecutive tokens", ("serve",)),
    _m("serve_requests", "count", NEITHER, "requests in the window", ("serve",)),
    _m("serve_queue_ms_{p50|p90|p99}", "ms", LOWER, "arrival to admission: waiting",
       ("serve",)),
    _m("serve_service_ms_{p50|p90|p99}", "ms", LOWER, "admission to last token: working",
       ("serve",)),
    _m("serve_percentile_requests", "count", NEITHER, "completed requests behind each percentile",
       ("serve",)),
    _m("failed_requests", "count", LOWER, "requests timed out or whose step raised", ("serve",)),
    _m("timed_out_requests", "count", LOWER, "requests dropped past scenario.timeout_ms",
       ("serve",)),
    _m("load_s", "s", LOWER, "cold start: the model built on the device", ("serve",)),
    _m("compile_s", "s", LOWER, "cold start: every bucket prepared and run once", ("serve",)),
    _m("first_request_ms", "ms", LOWER, "cold start: the first request, before warm-up",
       ("serve",)),
    _m("request_throughput_rps", "requests/s", HIGHER, "requests completed per second",
       ("serve",)),
    _m("output_tokens_per_s", "tokens/s", HIGHER, "output tokens per second", ("serve",)),
    _m("goodput_rps", "requests/s", HIGHER, "requests meeting every SLO per second", ("serve",)),
    _m("slo_attained_fraction", "fraction", HIGHER, "share of requests meeting every SLO",
       ("serve",)),
    _m("requested_rate_rps", "requests/s", NEITHER, "the arrival rate asked for", ("serve",)),
    _m("achieved_rate_rps", "requests/s", NEITHER, "the arrival rate achieved", ("serve",)),
    _m("completion_rate_rps", "requests/s", HIGHER, "how fast requests completed", ("serve",)),
    _m("admission_rate_rps", "requests/s", HIGHER,
       "how fast the queue was drained: the saturation verdict's figure", ("serve",)),
    _m("batches", "count", NEITHER, "batches served", ("serve",)),
    _m("mean_batch_size", "count", NEITHER, "requests per batch", ("serve",)),
    _m("serve_recompiles", "count", LOWER, "compilations inside the window", ("serve",)),
    _m("max_rate_under_slo_rps", "requests/s", HIGHER, "the highest rate meeting every SLO",
       ("serve",)),
    _m("highest_passing_rate_rps", "requests/s", HIGHER, "the same", ("serve",)),
    _m("lowest_failing_rate_rps", "requests/s", HIGHER, "the lowest rate that failed",
       ("serve",)),
    _m("max_concurrency_under_slo", "clients", HIGHER,
       "the most closed-loop clients meeting every SLO", ("serve",)),
    _m("lowest_failing_concurrency", "clients", HIGHER, "the fewest clients that failed",
       ("serve",)),
    _m("mismatched_requests", "count", LOWER,
       "requests served other tokens than their prompt decoded alone", ("serve",)),
    _m("first_mismatch_position", "token", NEITHER, "the earliest output position that differed",
       ("serve",)),
    _m("serve_output_checked_requests", "count", NEITHER,
       "requests whose tokens were checked", ("serve",)),
    _m("serve_output_check_s", "s", NEITHER, "the output check's time, outside the windows",
       ("serve",)),
    # scenario=pipeline
    _m("pipeline_samples_per_s", "samples/s", HIGHER, "the loader alone", ("pipeline",)),
    _m("resident_samples_per_s", "samples/s", HIGHER, "training on device-resident data",
       ("pipeline",)),
    _m("input_bound_fraction", "fraction, signed", LOWER, "the share of time lost to input",
       ("pipeline",)),
    # the resident window's own figures: unit and direction of the unprefixed key (lookup)
    _m("resident_{" + "|".join(
        [f"step_time_ms_{s}" for s in ("p50", "p90", "p99", "mean", "std")]
        + ["step_time_cv", "first_step_time_s", "compile_time_s", "achieved_tflops",
           "energy_j_per_sample", "power_w_mean", "host_other_cpu_frac", "host_steal_frac",
           "host_loadavg_1m", "host_other_cpu_frac_before"]) + "}",
       "as the unprefixed key", NEITHER, "the resident window's figures", ("pipeline",)),
    # scenario=checkpoint
    _m("checkpoint_save_s", "s", LOWER, "saving the full training state", ("checkpoint",)),
    _m("checkpoint_restore_s", "s", LOWER, "restoring it", ("checkpoint",)),
    _m("checkpoint_mib", "MiB", LOWER, "the checkpoint on disk", ("checkpoint",)),
    _m("checkpoint_restore_exact", "0 or 1", HIGHER, "1: the restore replayed the step exactly",
       ("checkpoint",)),
    _m("loss_next_step", "loss", NEITHER, "the next step's loss before saving", ("checkpoint",)),
    _m("loss_after_restore", "loss", NEITHER, "the same step's loss after restoring",
       ("checkpoint",)),
    _m("export_s", "s", LOWER, "exporting the model for serving", ("checkpoint",)),
    _m("export_mib", "MiB", LOWER, "the exported model on disk", ("checkpoint",)),
    _m("{live|export}_latency_ms_p50", "ms", LOWER, "median forward time, live and exported",
       ("checkpoint",)),
    _m("export_latency_ratio", "ratio", LOWER, "exported / live forward time", ("checkpoint",)),
    _m("export_max_rel_err", "ratio", LOWER, "the export's largest relative error",
       ("checkpoint",)),
    # scenario=scaling (the parent)
    _m("throughput_samples_per_s_x{N}", "samples/s", HIGHER, "throughput at N devices",
       ("scaling",)),
    _m("speedup_x{N}", "ratio", HIGHER, "throughput at N / at 1", ("scaling",)),
    _m("scaling_efficiency_x{N}", "fraction", HIGHER, "throughput at N / (N x at 1)",
       ("scaling",)),
    _m("scaling_efficiency", "fraction", HIGHER, "the efficiency at the largest N",
       ("scaling",)),
    # scenario=fit (the parent)
    _m("max_batch_size", "samples", HIGHER, "the largest batch that fitted", ("fit",)),
    _m("max_seq_len", "tokens", HIGHER, "the longest sequence that fitted", ("fit",)),
    _m("throughput_at_max_samples_per_s", "samples/s", HIGHER, "throughput at the found value",
       ("fit",)),
    _m("throughput_at_max_ci_{low|high}", "samples/s", HIGHER, "its 95% interval", ("fit",)),
    _m("throughput_at_max_tokens_per_s", "tokens/s", HIGHER, "the same in tokens/s", ("fit",)),
    _m("memory_per_sample_mib", "MiB", LOWER, "peak memory per sample (the line's slope)",
       ("fit",)),
    _m("fixed_memory_mib", "MiB", LOWER, "peak memory at batch 0 (the line's intercept)",
       ("fit",)),
    _m("memory_fit_r2", "fraction", NEITHER, "r^2 of that line", ("fit",)),
    _m("memory_budget_gib", "GiB", NEITHER, "the budget each probe was held to", ("fit",)),
    _m("fit_probes", "count", NEITHER, "probes the search ran", ("fit",)),
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


def lookup(key: str) -> Metric | None:
    """The registry entry naming a metric key, or None for a key fxtrack does not log. A
    resident window's figure (``resident_step_time_ms_p50``) reads as its unprefixed key."""
    for metric in METRICS:
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
