"""Build the records the writer logs: params, tags, metrics, artifacts of a run. Tags come from
MLflow's run-context registry (``mlflow.user``, ``mlflow.source.*``, fxtrack's own plugin),
resolved here in the orchestrator, not at upload time."""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any, Optional

from fxtrack import families, scenarios
from fxtrack.environment import SECRET_NAME, environment_snapshot, redact_uri_text
from fxtrack.frameworks.declaration import declaration
from fxtrack.measure.host_load import is_contended
from fxtrack.worker.protocol import JobSpec, Result

NOISY_CV = 0.10  # step-time coefficient of variation above which a run is tagged noisy

# Worker-reported device facts -> tag names.
_DEVICE_TAGS = {"device": "fxtrack.device", "cuda": "fxtrack.cuda", "cudnn": "fxtrack.cudnn",
                "framework_version": "fxtrack.framework_version", "python": "fxtrack.worker_python"}


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"layers": 2}}`` -> ``{"model.layers": 2}``; an empty mapping has no key,
    lists stay values (pandas.json_normalize's form, without pandas' 0.6 s import before a
    job's worker starts: the spool hold flattens the config)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def run_tags(tags: Optional[dict[str, str]] = None) -> dict[str, str]:
    """MLflow's standard tags for this process (``mlflow.user``, ``mlflow.source.name/type``,
    git commit) and every registered run-context plugin's (fxtrack's host tags), then ``tags``."""
    from mlflow.tracking.context.registry import resolve_tags

    resolved = {k: redact_uri_text(str(v)) for k, v in resolve_tags().items()}
    return dict(resolved, **(tags or {}))


def redact_overrides(overrides: list[str]) -> list[str]:
    """Overrides as they may be logged: URI credentials out, secret-named keys' values masked."""
    out = []
    for item in overrides:
        key, sep, value = item.partition("=")
        masked = sep and SECRET_NAME.search(key.rsplit(".", 1)[-1])
        out.append(f"{key}=***" if masked else redact_uri_text(item))
    return out


def series_times(series: dict[str, list[float]], end_ms: int,
                 stamped: Optional[dict[str, list[int]]] = None) -> dict[str, list[int]]:
    """Wall-clock time (ms) of each point. A series the worker stamped itself (``stamped``, e.g.
    system/... metrics, Result.series_times_ms) keeps its times. The per-step ones: the timed
    steps ran back to back and ended by ``end_ms`` (when the worker returned), so step i ended
    at end_ms minus the durations of the steps after it (``step_time_ms``); series of the same
    length share these times."""
    stamped = stamped or {}
    steps = series.get("step_time_ms") or []
    ends, t = [], float(end_ms)
    for d in reversed(steps):
        ends.append(int(t))
        t -= float(d)
    ends.reverse()
    return {k: (stamped[k] if len(stamped.get(k, ())) == len(v) else
                ends if len(v) == len(ends) else [end_ms] * len(v))
            for k, v in series.items()}


# Headline figures of a run's one-line summary (and a sweep's closing table), in order, where
# its scenario logged them.
HEADLINE = [("throughput_samples_per_s", "{:.1f} samples/s"), ("step_time_ms_p50", "step p50 {:.1f} ms"),
             ("compile_time_s", "compile {:.1f} s"), ("pipeline_samples_per_s", "loader {:.1f} samples/s"),
             ("input_bound_fraction", "input-bound {:.0%}"), ("checkpoint_save_s", "save {:.2f} s"),
             ("checkpoint_restore_s", "restore {:.2f} s"), ("checkpoint_mib", "checkpoint {:.0f} MiB"),
             ("export_s", "export {:.2f} s"),
             ("max_rate_under_slo_rps", "max rate under SLO {:.2f} req/s"),
             ("goodput_rps", "goodput {:.2f} req/s"), ("serve_e2e_ms_p99", "E2E p99 {:.1f} ms"), ("peak_mem_device_mib", "device peak {:.0f} MiB"),
             ("time_to_target_s", "to target {:.1f} s"), ("steps_to_target", "in {:.0f} steps"),
             ("final_eval_accuracy", "held-out accuracy {:.3f}"),
             ("final_eval_bits_per_byte", "held-out {:.3f} bits/byte"),
             ("final_eval_loss", "held-out loss {:.3f}"),
             ("peak_rss_mib", "RSS peak {:.0f} MiB"), ("mfu", "MFU {:.1%}")]


# Config keys that name fxtrack's own modules (how it runs, not what ran): not params.
INTERNAL_KEYS = ("framework.package",)


def config_params(config: dict[str, Any]) -> dict[str, Any]:
    """The config flattened to params: unset (None) keys and fxtrack's module paths left out,
    secrets removed."""
    params = {k: v for k, v in flatten(config).items()
              if k not in INTERNAL_KEYS and not _unset(v)}
    return _redacted(params)


def resolved_params(params: dict[str, Any], resolved: dict[str, Any],
                    tags: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """``params`` with what the worker resolved in place of what was asked
    (``hardware.name=auto`` -> the device kind, ``framework.compile=auto`` -> true|false, the
    threads it read back, the default batch/steps, scenario options left to the model family's
    defaults); a new dict."""
    tags = tags or {}
    params = dict(params)
    for key in ("batch_size", "steps", "warmup_steps"):
        if key in resolved:
            params[key] = resolved[key]
    if "device_kind" in resolved:
        params["hardware.name"] = resolved["device_kind"]
    for key, value in (resolved.get("scenario") or {}).items():  # options the worker filled in
        if not _unset(value):
            params[f"scenario.{key}"] = value
    if "compile" in resolved:
        params["framework.compile"] = str(bool(resolved["compile"])).lower()
    if tags.get("cpu_threads"):
        params["hardware.cpu_threads"] = tags["cpu_threads"]
    return _redacted(params)


def _redacted(params: dict[str, Any]) -> dict[str, Any]:
    for key, value in list(params.items()):
        if isinstance(value, str) and "://" in value:
            params[key] = redact_uri_text(value)
        if SECRET_NAME.search(key.rsplit(".", 1)[-1]):
            params[key] = "***"
    return params


def _unset(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def run_name(spec: JobSpec, size: str = "full", repeat: Optional[int] = None) -> str:
    """The run's name: ``<framework>-<model>-<scenario>-<precision>-x<devices>``, then what sets
    this config apart from the defaults, so distinct configs never share a name, e.g.
    ``torch-vit-train-fp32-x1-tiny-b2``, ``torch-bert-inference-fp32-x1-onnxruntime-dynamic_int8``,
    ``jax-vit-train-fp32-x1-fsdp-checkpoint-compile_false-r1`` (repeat 1 of a repeats run),
    ``jax-llama-serve-fp32-x1-tiny-continuous`` (a scenario's named option off its default)."""
    extras = [] if size == "full" else [size]
    extras += [f"{key}{value}" for key, value in _dims_set(spec, size).items()]
    if spec.seed != 0:
        extras.append(f"seed{spec.seed}")
    if spec.batch_size is not None:
        extras.append(f"b{spec.batch_size}")
    if spec.steps is not None:
        extras.append(f"s{spec.steps}")
    extras += [value for value, default in ((spec.runtime, "native"), (spec.quantize, "none"),
                                            (spec.parallel, "ddp"), (spec.memory, "none"))
               if value != default]
    if spec.compile_request != "auto":
        extras.append(f"compile_{spec.compile_request}")
    if spec.from_run:  # another model than the seeded one of the same dims
        extras.append(f"from_{spec.from_run['run_id'][:8]}")
    extras += _settings_set(spec)
    extras += _options_set(spec)
    if repeat is not None:
        extras.append(f"r{repeat}")
    base = f"{spec.framework}-{_model_name(spec)}-{spec.scenario}-{spec.precision}-x{spec.devices}"
    return "-".join([base, *extras])


def _model_name(spec: JobSpec) -> str:
    """The model as the name says it: ``custom[build_t5]`` for a user's model (the function
    this framework's builder names, once), the architecture's name otherwise."""
    name = spec.arch["name"]
    user = families.of(spec.arch).user
    if user is None:
        return name
    return user.run_label(spec.arch.get("dims", {}), declaration(spec.package).builder_key, name)


def _settings_set(spec: JobSpec) -> list[str]:
    """The framework's own settings set apart from their declared defaults: an identity setting
    by its value (``keras-...-torch``), any other as ``<key>_<value>`` (``donate_false``)."""
    try:
        declared = declaration(spec.package).settings
    except (ImportError, ValueError):  # a spec without a declaring package (a bench's fake)
        return []
    return [value if declared[key].identity else f"{key}_{value}"
            for key, value in spec.framework_settings.items()
            if key in declared and str(value) != declared[key].default]


def _options_set(spec: JobSpec) -> list[str]:
    """The scenario's named options set apart from their defaults, by value
    (``...-serve-...-continuous-lognormal``)."""
    scenario = scenarios.get(spec.scenario) if spec.scenario in scenarios.SCENARIOS else None
    if scenario is None or not scenario.named_options:
        return []
    typed, defaults = scenarios.options_of(spec), scenario.options()
    return [str(getattr(typed, key)) for key in scenario.named_options
            if getattr(typed, key) != getattr(defaults, key)]


def _dims_set(spec: JobSpec, size: str) -> dict[str, Any]:
    """Model sizes set apart from ``size``'s (``model.layers=2``): they make another model."""
    from fxtrack import architectures

    user = families.of(spec.arch).user
    if user is not None:  # a user's model: its builder is in the name, its kwargs here
        return user.dims_shown(spec.arch.get("dims", {}),
                               architectures.resolve(spec.arch["name"]).dims)
    try:
        default = architectures.resolve(spec.arch["name"], size).dims
    except (KeyError, ValueError):  # e.g. model=custom: no table entry to differ from
        return {}
    plain = lambda v: "x".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)  # noqa: E731
    return {k: plain(v) for k, v in spec.arch.get("dims", {}).items()
            if k in default and plain(default[k]) != plain(v)}


def note(summary: str) -> dict[str, str]:
    """The run's description in the MLflow UI (its Overview and the runs list's tooltip)."""
    return {"mlflow.note.content": summary[:MAX_NOTE_CHARS]}


MAX_NOTE_CHARS = 5000  # a tag value's limit in the older stores


def dataset_input(spec: JobSpec, resolved: dict[str, Any]) -> Optional[dict[str, Any]]:
    """What the run read, for MLflow's dataset input (``log_inputs``): fxtrack's synthetic data
    (or, for scenario=pipeline, the files written from it that the loader read), named by model,
    with the seed and shapes as the digest so runs on the same data show the same dataset."""
    real = resolved.get("dataset")
    if real is not None:  # data=<name> (fxtrack.data): the data itself, by its content hash
        return real_dataset_input(real, scenarios.get(spec.scenario).trains)
    batch = resolved.get("batch_size")
    if batch is None or families.of(spec.arch).describe is None:  # a user's model: its
        return None  # builder's data, whose shapes only the worker saw
    from fxtrack.data import synthetic
    from fxtrack.architectures import Arch

    shapes = synthetic.describe(Arch.from_json(spec.arch), int(batch))
    scenario = scenarios.get(spec.scenario)
    on_disk = scenario.reads_files
    name = f"{'files' if on_disk else 'synthetic'}-{spec.arch['name']}"
    digest = f"seed{spec.seed}-" + "-".join(f"{'x'.join(map(str, s['shape']))}"
                                             for s in shapes.values())
    return {"name": name, "digest": digest[:36],
            "source_type": "local" if on_disk else "code",
            "source": json.dumps({"generator": "fxtrack.data.synthetic", "seed": spec.seed,
                                  "samples": getattr(scenarios.options_of(spec),
                                                     "dataset_samples", None)}),
            "schema": json.dumps({"mlflow_tensorspec": {
                "features": json.dumps([{"name": k, "type": "tensor",
                                         "tensor-spec": {"dtype": s["dtype"],
                                                         "shape": [-1, *s["shape"][1:]]}}
                                        for k, s in shapes.items()]),
                "targets": None}}),
            "profile": json.dumps({"batch_size": int(batch)}),
            "context": "training" if scenario.trains else "inference"}


def real_dataset_input(real: dict[str, Any], trains: bool) -> dict[str, Any]:
    """A run's real data (``Result.resolved["dataset"]``, written by scenario=converge) as the
    same dataset input: its name, content digest, source, sample schema and split sizes."""
    dtype = {"bytes": "uint8"}.get(real["kind"], "float32")
    return {"name": f"data-{real['name']}", "digest": str(real["digest"])[:36],
            "source_type": "local", "source": json.dumps({"source": real["source"],
                                                          "holdout": real.get("holdout")}),
            "schema": json.dumps({"mlflow_tensorspec": {
                "features": json.dumps([{"name": real["kind"], "type": "tensor",
                                         "tensor-spec": {"dtype": dtype,
                                                         "shape": [-1, *real["shape"]]}}]),
                "targets": json.dumps({"classes": real["classes"]})}}),
            "profile": json.dumps(real["sizes"]),
            "context": "training" if trains else "inference"}


def open_record(spec: JobSpec, config: dict[str, Any], uri: str, experiment: str,
                parent_result_id: Optional[str], start_time_ms: int, name: Optional[str] = None,
                context: bool = True) -> dict[str, Any]:
    """One benchmark run before its outcome: where it goes, its name (default: run_name at the
    default size), the config's params and, unless ``context=False``, MLflow's run-context tags
    (their import, about 0.8 s, must not delay a fallback held before the worker starts: add
    them later with run_tags). Built once per run; close_record gives it its outcome."""
    return {"kind": "job", "result_id": spec.result_id,
            **_target(uri, experiment, parent_result_id), "run_name": name or run_name(spec),
            "parent_result_id": parent_result_id,
            "start_time_ms": start_time_ms, "params": config_params(config),
            "tags": run_tags() if context else {}, "context": context}


def with_context(opened: dict[str, Any]) -> dict[str, Any]:
    """An open record with MLflow's run-context tags (run_tags), added once."""
    if opened["context"]:
        return opened
    return dict(opened, tags=run_tags(opened["tags"]), context=True)


def close_record(opened: dict[str, Any], spec: JobSpec, result: Result,
                 summary: Optional[str] = None) -> dict[str, Any]:
    """``opened`` (open_record) with ``result``'s outcome: its status, figures and tags, the
    params the worker resolved, and ``summary`` (its console line) as the run's note."""
    tags = dict(opened["tags"])
    tags.update({_DEVICE_TAGS.get(k, f"fxtrack.{k}"): v for k, v in result.tags.items()})
    tags.update({
        "fxtrack.framework": spec.framework,
        "fxtrack.model": spec.arch["name"],
        "fxtrack.scenario": spec.scenario,
        "fxtrack.precision": spec.precision,
        "fxtrack.hardware": result.resolved.get("device_kind", spec.hardware),
        "fxtrack.devices": str(spec.devices),
        "fxtrack.status": _status(result),
    })
    if result.error:
        tags["fxtrack.error"] = result.error
    if result.guard != "ok":
        tags["fxtrack.guard"] = result.guard
    if result.metrics.get("step_time_cv", 0.0) > NOISY_CV:
        tags["fxtrack.noisy"] = "true"
    if summary:
        tags.update(note(summary))
    end_ms = int(time.time() * 1000)
    dataset = dataset_input(spec, result.resolved)
    return dict(
        opened, end_time_ms=end_ms, status=result.status, tags=tags,
        params=resolved_params(opened["params"], result.resolved, result.tags),
        metrics=result.metrics, series=result.series,
        series_times_ms=series_times(result.series, end_ms, result.series_times_ms),
        series_steps=result.series_steps, inputs=[dataset] if dataset else [],
        logged_model=logged_model(result))


def job_record(spec: JobSpec, result: Result, config: dict[str, Any], uri: str, experiment: str,
               parent_result_id: Optional[str], start_time_ms: int, name: Optional[str] = None,
               summary: Optional[str] = None) -> dict[str, Any]:
    """A run whose outcome is known when it is recorded (a window, a failed cell, a result
    adopted by sync): open_record then close_record."""
    return close_record(open_record(spec, config, uri, experiment, parent_result_id,
                                    start_time_ms, name), spec, result, summary)


# Exported artefact suffix -> the MLflow flavour that logs it as a model (TFLite has none: its
# file stays a plain artifact under model/).
MODEL_FLAVORS = {".onnx": "onnx"}


def logged_model(result: Result) -> Optional[dict[str, str]]:
    """A run's model as the writer logs it: the artifact folder (``model``, which Job.run
    passes), the file in it and the flavour (None: no MLflow flavour), and for a converge run
    the framework-neutral weights file beside it (``weights``: what ``model.from_run`` loads;
    with it the folder is a logged model even without a flavour). None: the run kept none."""
    path = result.artifacts.get("model") or result.artifacts.get("weights")
    if not path:
        return None
    out = {"artifact": "model", "file": os.path.basename(path),
           "flavor": MODEL_FLAVORS.get(os.path.splitext(path)[1])}
    if result.artifacts.get("weights"):
        out["weights"] = os.path.basename(result.artifacts["weights"])
    return out


def _target(uri: str, experiment: str, parent_result_id: Optional[str]) -> dict[str, Any]:
    """Where a record goes. The URI is stored without credentials (the writer gets the real one).
    Under ``mlflow run`` the entry point's run and experiment (MLFLOW_RUN_ID,
    MLFLOW_EXPERIMENT_ID) are adopted: a single job, or a sweep's parent, logs into that run."""
    adopt = os.environ.get("MLFLOW_RUN_ID") if parent_result_id is None else None
    return {"uri": redact_uri_text(uri), "experiment": experiment,
            "experiment_id": os.environ.get("MLFLOW_EXPERIMENT_ID"), "adopt_run_id": adopt}


def _status(result: Result) -> str:
    if result.status != "FINISHED":
        return "failed"
    return "ok" if result.guard == "ok" else "guard_failed"


def parent_record(result_id: str, uri: str, experiment: str, name: str, tags: dict[str, str],
                  status: str = "RUNNING", parent_result_id: Optional[str] = None,
                  metrics: Optional[dict[str, float]] = None,
                  start_time_ms: Optional[int] = None) -> dict[str, Any]:
    """A parent run (a sweep, or a scaling run's device counts): created RUNNING so children can
    link to it, logged again with its status and metrics when they are done."""
    now = int(time.time() * 1000)
    return {"kind": "sweep", "result_id": result_id,
            **_target(uri, experiment, parent_result_id), "run_name": name,
            "parent_result_id": parent_result_id, "status": status,
            "start_time_ms": start_time_ms or now, "end_time_ms": now, "params": {},
            "tags": run_tags(tags), "metrics": metrics or {}, "series": {}}


def report_record(uri: str, experiment: str, params: dict[str, Any]) -> dict[str, Any]:
    """The ``report`` run: host tags and ``fxtrack.kind=report``, no ``fxtrack.framework`` tag,
    so that the next report does not read it as a benchmark."""
    return {"kind": "job", "result_id": uuid.uuid4().hex, **_target(uri, experiment, None),
            "run_name": "report", "parent_result_id": None,
            "start_time_ms": int(time.time() * 1000), "status": "FINISHED", "params": params,
            "metrics": {}, "series": {}, "tags": run_tags({"fxtrack.kind": "report"})}


def environment_json() -> str:
    return json.dumps(environment_snapshot(), indent=1)


def sync_advice(uri: str) -> str:
    """How to deliver what ``uri`` missed: a plain `fxtrack sync` retries the URI each result was
    spooled with, so a mistyped URI needs the right one given to --uri (credentials never shown:
    they live in MLFLOW_TRACKING_USERNAME/PASSWORD)."""
    return (f"deliver later with `fxtrack sync --uri {redact_uri_text(uri)}` once that server "
            "answers (a mistyped URI: give the right one to --uri; a plain `fxtrack sync` "
            "retries the URI each result was spooled with)")


def fallback(record: dict[str, Any]) -> dict[str, Any]:
    """A parent's held last word (``spool.hold``): sync delivers it only to a run still RUNNING
    or absent, never over a close its orchestrator already logged (issue 60)."""
    return dict(record, fallback=True)


GONE_PARENT = ("its orchestrator was gone before it closed this run (killed: SIGKILL, the OOM "
               "killer, a reboot); closed by fxtrack sync")
GONE = ("its orchestrator was gone before it logged the run (killed: SIGKILL, the OOM killer, "
        "a reboot)")


def held_job(record: dict[str, Any], job_dir: str, config: dict[str, Any]) -> dict[str, Any]:
    """The fallback a job holds in the spool while its worker runs (``spool.hold``): FAILED,
    saying why, unless the worker's own result is there when sync delivers it (``adopted``)."""
    return dict(record, adopt={"job_dir": job_dir, "config": config})


def adopted(record: dict[str, Any], files: list[tuple[str, Any]]
            ) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """A held job record delivered by sync because its orchestrator died: the worker's
    finished ``result.json`` becomes the run (same result id: logged once), else the FAILED
    fallback; either way with the worker's log."""
    adopt = record.pop("adopt", None)
    if not adopt:
        return record, files
    from pathlib import Path

    job_dir = Path(adopt["job_dir"])
    spec_path, result_path, log = (job_dir / "spec.json", job_dir / "result.json",
                                   job_dir / "worker.log")
    files = [(n, p) for n, p in files if n not in ("result.json", "worker.log")]
    if log.is_file():
        files.append(("worker.log", log))
    try:
        result = Result.read(result_path) if result_path.is_file() else None
        spec = JobSpec.read(spec_path)
    except (OSError, ValueError, TypeError):
        result = None
    if result is None or result.status != "FINISHED" or result.result_id != record["result_id"]:
        return record, files
    name = record["run_name"]
    new = job_record(spec, result, adopt["config"], record["uri"], record["experiment"],
                     record["parent_result_id"], record["start_time_ms"], name,
                     f"{name}: FINISHED; logged by fxtrack sync, as {GONE} (no MFU or cost "
                     "figures: the orchestrator adds those)")
    new.update(experiment_id=record.get("experiment_id"), adopt_run_id=record.get("adopt_run_id"))
    if "fxtrack.config_id" in record["tags"]:  # the orchestrator's tag: resume=true finds it
        new["tags"]["fxtrack.config_id"] = record["tags"]["fxtrack.config_id"]
    return new, [*files, ("result.json", result_path)]


def summary_line(name: str, result: Result) -> str:
    """One line per run: status and the headline figures its scenario logged."""
    if result.status != "FINISHED":
        return f"{name}: {result.status}: {result.error}"
    m = result.metrics
    parts = [fmt.format(m[key]) for key, fmt in HEADLINE if key in m]
    source = result.tags.get("peak_tflops_source", "")
    if "mfu" in m and source.startswith("machine-best:"):  # say which yardstick the MFU is on
        parts[-1] += f" (of this machine's best matmul rate, {source.partition(':')[2]}'s)"
    notes = "" if result.guard == "ok" else f"  WARNING: correctness guard: {result.guard}"
    if m.get("mfu", 0.0) > 1.0:  # impossible: the peak or the FLOP count is wrong
        notes += (f"  WARNING: MFU {m['mfu']:.0%} > 100%: peak {m.get('peak_tflops', 0):.1f} "
                  f"TFLOP/s ({result.tags.get('peak_tflops_source', '?')}) is below this run's rate")
    if result.tags.get("peak_contended") == "true":
        notes += ("  NOTE: no MFU: the peak FLOP/s was calibrated while other processes used the "
                  "cores (not cached; a quiet run calibrates again)")
    if m.get("reached_target") == 0.0:  # scenario=converge: FINISHED, the target not met
        notes += "  NOTE: target not reached within the budget"
    if result.tags.get("trajectory", "").startswith("diverged"):
        notes += (f"  NOTE: training losses {result.tags['trajectory']} from "
                  f"{result.tags.get('trajectory_reference')}'s")
    if m.get("step_time_cv", 0.0) > NOISY_CV:
        notes += f"  NOTE: noisy: step times vary {m['step_time_cv']:.0%} (CV > {NOISY_CV:.0%})"
    if is_contended(m.get("host_other_cpu_frac")):
        notes += (f"  CONTENDED: other processes took {m['host_other_cpu_frac']:.0%} of the "
                  "cores during the timed window")
    foreign = result.tags.get("gpu_foreign_processes") or result.tags.get("gpu_foreign_processes_before")
    if foreign:
        notes += f"  CONTENDED: other processes on the run's GPUs ({foreign})"
    if result.tags.get("gpu_throttled"):
        notes += f"  THROTTLED: the GPU slowed its clocks ({result.tags['gpu_throttled']})"
    return f"{name}: " + ", ".join(parts) + notes
