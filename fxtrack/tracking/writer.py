"""The one MLflow writer: turns a spooled record into an MLflow run, exactly once.

A record is either a ``job`` (one benchmark run, logged whole) or a ``sweep`` (the parent run of
a multirun, created when the sweep starts and closed when it ends). Runs are found again by
their ``fxtrack.result_id`` tag, which makes logging idempotent: ``fxtrack sync`` may replay a
spool entry that was half-logged when the server went away.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional

from fxtrack.environment import redact_uri_text
from fxtrack.tracking import spool

# An unreachable server should cost seconds, not the minutes of MLflow's default back-off.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")

import mlflow  # noqa: E402
from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

_BATCH = 100  # MLflow accepts at most 100 params / 100 tags / 1000 metrics per log_batch


class TrackingUnavailable(RuntimeError):
    """The tracking server could not take the run; the record stays in the spool."""


def tracking_uri(configured: Optional[str], launch_dir: str) -> str:
    """``tracking.uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<launch dir>/mlflow.db``."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI")
    return uri or f"sqlite:///{Path(launch_dir).resolve() / 'mlflow.db'}"


def _experiment_id(client: MlflowClient, name: str, uri: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if uri.startswith("sqlite:///"):  # artifacts beside the database, not in the cwd
        location = (Path(uri[len("sqlite:///"):]).parent / "mlruns").as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except mlflow.exceptions.MlflowException:  # created meanwhile by a concurrent process
        return client.get_experiment_by_name(name).experiment_id


def find_run(client: MlflowClient, experiment_id: str, result_id: str):
    runs = client.search_runs([experiment_id], f"tags.`fxtrack.result_id` = '{result_id}'",
                              max_results=5)
    return runs[0] if runs else None


def log_entry(entry: Path, uri: Optional[str] = None) -> str:
    """Log one spool entry (to ``uri``, else the record's own); returns the run id.
    Raises TrackingUnavailable when the server cannot take it."""
    record = spool.load(entry)
    try:
        return _log(entry, record, uri or record["uri"])
    except mlflow.exceptions.MlflowException as e:
        raise TrackingUnavailable(_explain(e, record)) from e
    except (OSError, ConnectionError) as e:
        raise TrackingUnavailable(f"{type(e).__name__}: {e}") from e


def _explain(e: Exception, record: dict[str, Any]) -> str:
    text = str(e)
    if "401" in text or "Unauthorized" in text or "UNAUTHENTICATED" in text:
        return ("the tracking server rejected the credentials (HTTP 401): check "
                "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN")
    if "403" in text or "PERMISSION_DENIED" in text:
        return (f"the tracking server refused access (HTTP 403): this user has no permission "
                f"on experiment {record['experiment']!r}")
    return redact_uri_text(text.splitlines()[0][:300]) if text else type(e).__name__


def _log(entry: Path, record: dict[str, Any], uri: str) -> str:
    client = MlflowClient(uri)
    adopt = record.get("adopt_run_id")  # the run `mlflow run` created for this entry point
    if adopt:
        exp_id = client.get_run(adopt).info.experiment_id
    else:
        exp_id = record.get("experiment_id") or _experiment_id(client, record["experiment"], uri)
    existing = find_run(client, exp_id, record["result_id"])
    if record["kind"] == "sweep":
        run_id = existing.info.run_id if existing else _create(client, exp_id, record, adopt)
        if record["status"] != "RUNNING":
            _log_values(client, run_id, record)
            client.set_terminated(run_id, record["status"])
        return run_id
    if existing is not None:
        if existing.info.status != "RUNNING":
            return existing.info.run_id  # logged completely before: nothing to do
        if existing.info.run_id != adopt:
            client.delete_run(existing.info.run_id)  # a half-logged earlier attempt
    run_id = _create(client, exp_id, record, adopt)
    if adopt:
        record = _without_param_clashes(client, adopt, record)
    _log_values(client, run_id, record)
    artifacts = entry / "artifacts"
    for path in sorted(artifacts.iterdir()) if artifacts.is_dir() else []:
        client.log_artifact(run_id, str(path))
    client.set_terminated(run_id, record["status"])
    return run_id


def _create(client: MlflowClient, exp_id: str, record: dict[str, Any],
            adopt: Optional[str] = None) -> str:
    """A new run for ``record`` (or the adopted one), tagged with its result id and parent."""
    tags = dict(record["tags"], **{"fxtrack.result_id": record["result_id"]})
    parent_id = record.get("parent_result_id")
    if parent_id:
        parent = find_run(client, exp_id, parent_id)
        if parent is not None:
            tags["mlflow.parentRunId"] = parent.info.run_id
    if adopt:
        tags["mlflow.runName"] = record["run_name"]
        client.log_batch(adopt, tags=[RunTag(k, str(v)) for k, v in tags.items()])
        return adopt
    run = client.create_run(exp_id, run_name=record["run_name"], tags=tags,
                            start_time=record.get("start_time_ms"))
    return run.info.run_id


def _without_param_clashes(client: MlflowClient, run_id: str,
                           record: dict[str, Any]) -> dict[str, Any]:
    """An adopted run may already hold a param with another value (``mlflow run`` logs
    ``batch_size=null``; fxtrack resolved it to 256). MLflow params are immutable, so the
    resolved value goes under ``fxtrack.resolved.<key>``."""
    logged = client.get_run(run_id).data.params
    params = {}
    for key, value in record.get("params", {}).items():
        clash = key in logged and logged[key] != str(value)
        params[f"fxtrack.resolved.{key}" if clash else key] = value
    return dict(record, params=params)


def _log_values(client: MlflowClient, run_id: str, record: dict[str, Any]) -> None:
    now = int(time.time() * 1000)
    params = [Param(k, str(v)[:6000]) for k, v in record.get("params", {}).items()]
    tags = [RunTag(k, str(v)[:5000]) for k, v in record.get("tags", {}).items()]
    metrics = [Metric(k, float(v), now, 0) for k, v in record.get("metrics", {}).items()]
    for key, values in record.get("series", {}).items():
        metrics += [Metric(key, float(v), now, i) for i, v in enumerate(values)]
    while params or tags or metrics:
        client.log_batch(run_id, metrics=metrics[:1000], params=params[:_BATCH], tags=tags[:_BATCH])
        params, tags, metrics = params[_BATCH:], tags[_BATCH:], metrics[1000:]


def deliver(entry: Path, uri: Optional[str] = None) -> str:
    """Log a spool entry, then clear it; on TrackingUnavailable the entry stays spooled."""
    run_id = log_entry(entry, uri)
    spool.remove(entry)
    return run_id

