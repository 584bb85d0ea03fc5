"""fxtrack's own scenarios, each registered once (``fxtrack.scenarios.registry``). The order is
the report's. A scenario's refusal here is what needs its options and the model family only;
its values were checked by its options' ``__post_init__``."""

from __future__ import annotations

from typing import Any, Optional

from fxtrack.scenarios import options as o
from fxtrack.scenarios.registry import Objective, Scenario, register

# what measures an objective: {frameworks} and {model} are filled in by the answer page
_MEASURE = "python -m fxtrack -m framework={frameworks} model={model} scenario=%s repeats=3"


def serve_refusal(options: o.ServeOptions, family: Any, batch_size: Optional[int]) -> Optional[str]:
    """Bad serve input the values alone cannot show, one line, before any work."""
    from fxtrack.scenarios.batching import length_data_refusal  # numpy: when serve is asked

    why = options.refusal(family.generates) or length_data_refusal(options.length_dist,
                                                                   options.length_data)
    largest = options.buckets[-1]
    if why is None and batch_size is not None and batch_size != largest:
        # the model is built at the largest bucket: another batch_size would be dropped
        return (f"scenario=serve builds the model at its largest batch bucket ({largest}, from "
                f"scenario.max_batch / scenario.batch_buckets); batch_size={batch_size} would "
                f"be ignored: drop it, or set scenario.max_batch={batch_size}")
    return why


def converge_refusal(options: o.ConvergeOptions, family: Any,
                     batch_size: Optional[int]) -> Optional[str]:
    """A metric this kind of model has no figure for, or a target outside the metric's range
    (the family's default metric when none is set), one line, before any work."""
    takes = family.converge_metrics
    if options.metric is not None and options.metric not in takes:
        return (f"scenario.metric={options.metric} has no figure for model family "
                f"{family.name!r} (it takes {', '.join(takes)})")
    try:
        options.target_refusal(options.metric or takes[0])
    except ValueError as e:
        return str(e)
    return None


TRAIN = register(Scenario(
    "train", "training steps on synthetic data: throughput, step time, memory, MFU",
    o.TrainOptions, "fxtrack.scenarios.train:run", option_needs=(("profile_steps", "profile"),),
    objectives=(
        Objective("train", "Training throughput", ("throughput_samples_per_s",), "common",
                  ("trains", "as fast as"), _MEASURE % "train", rank=0),
        Objective("memory", "Peak memory at equal batch", ("peak_mem_device_mib", "peak_rss_mib"),
                  "common", ("trains", "the peak memory of"), _MEASURE % "train", rank=70,
                  fraction=True),
        Objective("cost", "Cost per 1M samples", ("cost_per_1m_samples",), "common",
                  ("trains", "cheaper than"),
                  _MEASURE % "train" + " hardware.price_per_hour=<price>", rank=80),
        # the compile time first, as the run's own line and docs/reading-the-answer.md say it
        Objective("compile", "Compile / first-step time", ("compile_time_s", "first_step_time_s"),
                  "common", ("starts training", "faster than"), _MEASURE % "train", rank=90))))
INFERENCE = register(Scenario(
    "inference", "forward-only latency per batch, in the framework or a deployment runtime",
    o.InferenceOptions, "fxtrack.scenarios.inference:run", trains=False, deploys=True,
    from_run=True,
    objectives=(
        Objective("latency", "Inference latency at batch 1", ("latency_ms_p50",), "one",
                  ("answers one sample of", "faster than"),
                  (_MEASURE % "inference").replace(" repeats", " batch_size=1 repeats"), rank=20),
        Objective("inference", "Inference throughput at the largest batch",
                  ("throughput_samples_per_s",), "largest", ("infers", "as fast as"),
                  _MEASURE % "inference", rank=30))))
GENERATE = register(Scenario(
    "generate", "greedy decoding with a KV cache: time to first token, decode tokens/s",
    o.GenerateOptions, "fxtrack.scenarios.generate:run", needs=("generate",), trains=False,
    decodes=True, objectives=(
        Objective("ttft", "Generation: time to first token", ("ttft_ms_p50",), "common",
                  ("starts generating", "faster than"), _MEASURE % "generate", rank=50,
                  lm_only=True),
        Objective("decode", "Generation: decode tokens/s", ("decode_tokens_per_s",), "common",
                  ("decodes", "as fast as"), _MEASURE % "generate", rank=60, lm_only=True))))
SCALING = register(Scenario(
    "scaling", "training throughput at 1, 2, 4, ... devices and the scaling efficiency",
    o.ScalingOptions, "fxtrack.scenarios.train:run",
    driver="fxtrack.orchestrator.scaling:run_scaling", sweeps_devices=True))
PIPELINE = register(Scenario(
    "pipeline", "each framework's input pipeline from files on disk, then training on it",
    o.PipelineOptions, "fxtrack.scenarios.pipeline:run", needs=("pipeline",), reads_files=True))
CHECKPOINT = register(Scenario(
    "checkpoint", "saving, restoring and exporting the training state",
    o.CheckpointOptions, "fxtrack.scenarios.checkpoint:run"))
FIT = register(Scenario(
    "fit", "the largest batch (or sequence) that trains within a memory budget",
    o.FitOptions, "fxtrack.scenarios.train:run",  # each probe is a short training run
    config_check="fxtrack.config.fit:check", memory_floor=False,
    driver="fxtrack.orchestrator.fit:run_fit", section="fxtrack.report.fit:section",
    objectives=(
        Objective("fit", "Largest batch that fits",
                  ("max_batch_size", "throughput_at_max_samples_per_s"), "largest",
                  ("fits", "as large a batch of"), _MEASURE % "fit", rank=10),)))
SERVE = register(Scenario(
    "serve", "requests arriving at a rate, batched: latency percentiles, goodput under SLOs",
    o.ServeOptions, "fxtrack.scenarios.serve:run", refusal=serve_refusal, trains=False,
    decodes=True, from_run=True, section="fxtrack.report.serving:section",
    named_options=("batching", "length_dist"), objectives=(
        Objective("serve", "Serving capacity under the SLOs",
                  ("max_rate_under_slo_rps", "goodput_rps"), "common",
                  ("serves", "as many requests/s of"), _MEASURE % "serve", rank=40,
                  modes=("scenario.batching",)),
        # capacity planned in users: the most closed-loop clients meeting every SLO
        Objective("users", "Serving capacity in concurrent users", ("max_concurrency_under_slo",),
                  "common", ("serves", "as many concurrent users of"),
                  _MEASURE % "serve" + " scenario.concurrency=search scenario.slo.e2e_ms=<ms>",
                  rank=41,
                  modes=("scenario.batching",)),)))
CONVERGE = register(Scenario(
    "converge", "training on real data to a held-out target: time, steps and samples to it",
    o.ConvergeOptions, "fxtrack.scenarios.converge:run", refusal=converge_refusal,
    needs=("converge",), devices_need="converge_devices", real_data=True, config_check="fxtrack.scenarios.converge:config_check",
    cross_check="fxtrack.scenarios.converge:cross_check", section="fxtrack.report.converge:section",
    objectives=(
        # on real data (MLPerf Training's rule: a verdict from 5 seeds, fastest and slowest dropped)
        Objective("quality", "Time to quality", ("time_to_target_s",), "common",
                  ("reaches its target on", "the time of"),
                  (_MEASURE % "converge").replace("repeats=3", "data=mnist repeats=5"), rank=10,
                  fraction=True, repeats_rule="fxtrack.report.converge:middle"),)))
