"""Build the records the writer logs: params, tags, metrics, artifacts of a run. Tags come from
MLflow's run-context registry (``mlflow.user``, ``mlflow.source.*``, fxtrack's own plugin),
resolved here in the orchestrator, not at upload time."""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any, Optional

from fxtrack.environment import SECRET_NAME, environment_snapshot, redact_uri, redact_uri_text
from fxtrack.job import JobSpec, Result

NOISY_CV = 0.10  # step-time coefficient of variation above which a run is tagged noisy

# Worker-reported device facts -> tag names.
_DEVICE_TAGS = {"device": "fxtrack.device", "cuda": "fxtrack.cuda", "cudnn": "fxtrack.cudnn",
                "framework_version": "fxtrack.framework_version", "python": "fxtrack.worker_python"}


def flatten(tree: dict[str, Any]) -> dict[str, Any]:
    """``{"model": {"layers": 2}}`` -> ``{"model.layers": 2}`` (pandas.json_normalize)."""
    import pandas as pd

    return pd.json_normalize(tree, sep=".").iloc[0].to_dict() if tree else {}


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


def params_from(config: dict[str, Any], resolved: dict[str, Any]) -> dict[str, Any]:
    """Flattened config params, with the defaults the worker chose filled in and secrets removed."""
    params = flatten(config)
    for key in ("batch_size", "steps", "warmup_steps"):
        if params.get(key) is None and key in resolved:
            params[key] = resolved[key]
    for key, value in list(params.items()):
        if isinstance(value, str) and "://" in value:
            params[key] = redact_uri_text(redact_uri(value))
        if SECRET_NAME.search(key.rsplit(".", 1)[-1]):
            params[key] = "***"
    return params


def run_name(spec: JobSpec) -> str:
    return f"{spec.framework}-{spec.arch['name']}-{spec.scenario}-{spec.precision}-x{spec.devices}"


def display_name(spec: JobSpec) -> str:
    """The run name plus what sets this config apart where the run name cannot: lever values
    other than their defaults and a forced ``framework.compile``, e.g. ``torch-bert-inference-
    fp32-x1 [onnxruntime, dynamic_int8]``. For console lines and closing tables; the MLflow run
    name keeps the form of docs/contract.md#run-layout (the levers are params there)."""
    extras = [value for value, default in ((spec.runtime, "native"), (spec.quantize, "none"),
                                           (spec.parallel, "ddp"), (spec.memory, "none"))
              if value != default]
    if spec.compile_request != "auto":
        extras.append(f"compile={spec.compile_request}")
    return run_name(spec) + (f" [{', '.join(extras)}]" if extras else "")


def job_record(spec: JobSpec, result: Result, config: dict[str, Any], uri: str, experiment: str,
               parent_result_id: Optional[str], start_time_ms: int) -> dict[str, Any]:
    tags = run_tags()
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
    end_ms = int(time.time() * 1000)
    return {
        "kind": "job", "result_id": spec.result_id, **_target(uri, experiment, parent_result_id),
        "run_name": run_name(spec), "parent_result_id": parent_result_id,
        "start_time_ms": start_time_ms, "end_time_ms": end_ms, "status": result.status,
        "params": params_from(config, result.resolved), "tags": tags,
        "metrics": result.metrics, "series": result.series,
        "series_times_ms": series_times(result.series, end_ms, result.series_times_ms),
    }


def _target(uri: str, experiment: str, parent_result_id: Optional[str]) -> dict[str, Any]:
    """Where a record goes. The URI is stored without credentials (the writer gets the real one).
    Under ``mlflow run`` the entry point's run and experiment (MLFLOW_RUN_ID,
    MLFLOW_EXPERIMENT_ID) are adopted: a single job, or a sweep's parent, logs into that run."""
    adopt = os.environ.get("MLFLOW_RUN_ID") if parent_result_id is None else None
    return {"uri": redact_uri(uri), "experiment": experiment,
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
    return (f"deliver later with `fxtrack sync --uri {redact_uri(uri)}` once that server "
            "answers (a mistyped URI: give the right one to --uri; a plain `fxtrack sync` "
            "retries the URI each result was spooled with)")
