"""The one MLflow writer: turns a spooled record into an MLflow run, exactly once.

A record is either a ``job`` (one benchmark run, logged whole) or a ``sweep`` (the parent run of
a multirun, created when the sweep starts and closed when it ends). Runs are found again by
their ``fxtrack.result_id`` tag, which makes logging idempotent: ``fxtrack sync`` may replay a
spool entry that was half-logged when the server went away.

Every delivery error ends as one of two exceptions, classified by HTTP status
(``MlflowException.get_http_status_code()``), never by the text of a message:
``TrackingUnavailable`` (the server or store is down, busy or slow: retry later, the entry stays
spooled) and its subclass ``TrackingRejected`` (4xx: bad credentials, no permission, a deleted
experiment, a malformed URI: retrying cannot help, the message says what to fix).
"""

from __future__ import annotations

import os
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from fxtrack.environment import redact_uri, redact_uri_text
from fxtrack.tracking import spool

# An unreachable server should cost seconds, not the minutes of MLflow's default back-off.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")

import mlflow  # noqa: E402
from filelock import FileLock  # noqa: E402
from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

# A server that accepts connections but never answers is found out by one /health request with
# this timeout (seconds), instead of MLflow's 3 x 15 s per request.
PROBE_TIMEOUT_S = float(os.environ.get("FXTRACK_PROBE_TIMEOUT_S", "5"))
SCHEMES = ("http", "https", "sqlite", "file", "postgresql", "mysql", "mssql", "databricks")
_DOWN: dict[str, str] = {}  # uri -> why: once down, the rest of this process spools at once


class TrackingUnavailable(RuntimeError):
    """The tracking server could not take the run now; the record stays in the spool."""


class TrackingRejected(TrackingUnavailable):
    """The tracking target refuses the run for a reason retrying cannot fix (HTTP 4xx, a bad
    URI or experiment); the message says what to fix."""


class EntryBusy(TrackingUnavailable):
    """Another process has claimed this spool entry and is uploading it."""


def tracking_uri(configured: Optional[str], launch_dir: str) -> str:
    """``tracking.uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<launch dir>/mlflow.db``."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI")
    return uri or f"sqlite:///{Path(launch_dir).resolve() / 'mlflow.db'}"


def client_for(uri: str) -> MlflowClient:
    """A client for ``uri``. A sqlite store is created and migrated once, under a file lock:
    several first runs at once otherwise race in alembic's migration and all but one crash."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        db.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{db}.lock", timeout=600):
            _sqlite_store(uri)
    return MlflowClient(uri)


def _sqlite_store(uri: str):
    """The embedded store with MLflow's default artifact root beside the database
    (``<db dir>/mlruns``, then ``<experiment id>/<run id>/artifacts``), whatever the cwd."""
    from mlflow.tracking._tracking_service.utils import _get_store

    root = (Path(uri[len("sqlite:///"):]).parent / "mlruns").as_uri()
    return _get_store(uri, artifact_uri=root)  # cached per (uri, root) by MLflow


def check_target(uri: str, experiment: str) -> None:
    """Before any work: the URI's scheme, the experiment name, the experiment not deleted, and
    under ``mlflow run`` the same server as the run it created. Raises TrackingRejected (fix
    it), or TrackingUnavailable (cannot tell now: the run goes ahead and is spooled)."""
    where = redact_uri(uri)
    scheme = urlsplit(uri).scheme.split("+")[0]
    if scheme not in SCHEMES:
        raise TrackingRejected(f"tracking.uri {where!r} is not a tracking URI (scheme must be one "
                               f"of {', '.join(SCHEMES)})")
    if scheme in ("http", "https") and not urlsplit(uri).hostname:
        raise TrackingRejected(f"tracking.uri {where!r} names no host")
    if not experiment or not experiment.strip():
        raise TrackingRejected("tracking.experiment is empty: name an experiment")
    run_env = os.environ.get("MLFLOW_RUN_ID")
    env_uri = os.environ.get("MLFLOW_TRACKING_URI")
    if run_env and env_uri and redact_uri(env_uri) != where:
        raise TrackingRejected(f"under `mlflow run` fxtrack logs into the run mlflow created at "
                               f"{redact_uri(env_uri)}; tracking.uri={where} names another "
                               "server: drop tracking.uri or pass it to `mlflow run` instead")
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        return  # a new embedded store: nothing to check, and checking must not create it
    probe(uri)
    try:
        exp = client_for(uri).get_experiment_by_name(experiment)
    except Exception as e:  # noqa: BLE001 - classified below
        raise classify(e, {"experiment": experiment, "uri": where}) from None
    if exp is not None and exp.lifecycle_stage == "deleted":
        raise TrackingRejected(f"experiment {experiment!r} at {where} is deleted: restore it "
                               f"(mlflow experiments restore --experiment-id {exp.experiment_id}) "
                               "or choose another tracking.experiment")


def probe(uri: str) -> None:
    """For an HTTP server: one ``/health`` request with a short timeout, remembered for the rest
    of the process. Raises TrackingUnavailable when it does not answer."""
    if uri in _DOWN:
        raise TrackingUnavailable(_DOWN[uri])
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S) as r:
            r.read(64)
    except urllib.error.HTTPError:
        return  # it answers; the API calls will say what is wrong
    except Exception as e:  # noqa: BLE001 - refused, reset, timed out: all mean "not now"
        mark_down(uri, f"no answer from {redact_uri(uri)}/health within {PROBE_TIMEOUT_S:g} s "
                       f"({type(e).__name__})")
        raise TrackingUnavailable(_DOWN[uri]) from None


def mark_down(uri: str, why: str) -> None:
    _DOWN[uri] = why


def classify(e: BaseException, record: dict[str, Any]) -> TrackingUnavailable:
    """Any delivery error as TrackingRejected (HTTP 4xx: say what to fix) or
    TrackingUnavailable (anything else: retry later)."""
    if isinstance(e, TrackingUnavailable):
        return e
    if isinstance(e, mlflow.exceptions.MlflowException):
        status = e.get_http_status_code()
        if status == 401:
            return TrackingRejected(
                "the tracking server rejected the credentials (HTTP 401): check "
                "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN")
        if status == 403:
            return TrackingRejected(
                f"the tracking server refused access (HTTP 403): this user has no permission "
                f"on experiment {record.get('experiment')!r}")
        if 400 <= status < 500 and status != 429:
            return TrackingRejected(f"the tracking server refused the run (HTTP {status}): "
                                    f"{_first_line(e)}")
        return TrackingUnavailable(f"HTTP {status}: {_first_line(e)}")
    if isinstance(e, (OSError, ConnectionError)):
        return TrackingUnavailable(f"{type(e).__name__}: {_first_line(e)}")
    # e.g. sqlalchemy's OperationalError ("database is locked"): keep the entry, retry later.
    return TrackingUnavailable(f"{type(e).__name__}: {_first_line(e)}")


def _first_line(e: BaseException) -> str:
    text = (getattr(e, "message", None) or str(e)).strip()
    return redact_uri_text(text.splitlines()[0][:300]) if text else type(e).__name__


def _experiment_id(client: MlflowClient, name: str, uri: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            raise TrackingRejected(f"experiment {name!r} is deleted: restore it or choose "
                                   "another tracking.experiment")
        return exp.experiment_id
    try:
        if uri.startswith("sqlite:///"):
            return _sqlite_store(uri).create_experiment(name)
        return client.create_experiment(name)
    except mlflow.exceptions.MlflowException:  # created meanwhile by a concurrent process
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def find_runs(client: MlflowClient, experiment_id: str, result_id: str) -> list:
    """Every run carrying ``result_id``, oldest first."""
    runs = client.search_runs([experiment_id], f"tags.`fxtrack.result_id` = '{result_id}'",
                              max_results=50, order_by=["attributes.start_time ASC"])
    return sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))


def find_run(client: MlflowClient, experiment_id: str, result_id: str):
    runs = find_runs(client, experiment_id, result_id)
    return runs[0] if runs else None


def log_entry(entry: Path, uri: Optional[str] = None) -> str:
    """Log one spool entry (to ``uri``, else the record's own); returns the run id.
    Raises TrackingUnavailable (or TrackingRejected) when the target cannot take it."""
    record = spool.load(entry)
    target = uri or record["uri"]
    try:
        probe(target)
        return _log(entry, record, target)
    except Exception as e:  # noqa: BLE001 - every delivery error is classified, none crashes
        error = classify(e, record)
        server_error = not isinstance(e, TrackingUnavailable)  # not our own "busy, later"
        if server_error and not isinstance(error, TrackingRejected) and \
                target.startswith(("http://", "https://")):
            mark_down(target, str(error))  # the rest of this process spools without trying
        raise error from None


def _log(entry: Path, record: dict[str, Any], uri: str) -> str:
    client = client_for(uri)
    adopt = record.get("adopt_run_id")  # the run `mlflow run` created for this entry point
    if adopt:
        exp_id = client.get_run(adopt).info.experiment_id
    else:
        exp_id = record.get("experiment_id") or _experiment_id(client, record["experiment"], uri)
    existing = find_run(client, exp_id, record["result_id"])
    if record["kind"] == "sweep":
        run_id = existing.info.run_id if existing else _create(client, exp_id, record, uri, adopt)
        if record["status"] != "RUNNING":
            _log_values(client, run_id, record)
            client.set_terminated(run_id, record["status"], end_time=record.get("end_time_ms"))
        return run_id
    if existing is not None:
        if existing.info.status != "RUNNING":
            return existing.info.run_id  # logged completely before: nothing to do
        if existing.info.run_id != adopt and (_stale(existing) or _mine(existing)):
            client.delete_run(existing.info.run_id)  # a half-logged attempt nobody writes now
        elif existing.info.run_id != adopt:
            raise TrackingUnavailable(f"run {existing.info.run_id} for this result is being "
                                      "written by another process; try again later")
    run_id = _create(client, exp_id, record, uri, adopt)
    if adopt:
        record = _without_param_clashes(client, adopt, record)
    _log_values(client, run_id, record)
    artifacts = entry / "artifacts"
    for path in sorted(artifacts.iterdir()) if artifacts.is_dir() else []:
        client.log_artifact(run_id, str(path))
    client.set_terminated(run_id, record["status"], end_time=record.get("end_time_ms"))
    return run_id


# A RUNNING run of this result whose writer is gone is a half-logged leftover, safe to replace.
# Gone: its process (same host) is dead, or its attempt began longer ago than this lease; a live
# writer logs a whole run in seconds, far within it.
STALE_RUN_S = float(os.environ.get("FXTRACK_STALE_RUN_S", "600"))
WRITER_TAG = "fxtrack.writer"  # host:pid:ms of the attempt that created the run


def _writer_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{int(time.time() * 1000)}"


def _stale(run) -> bool:
    host, _, rest = run.data.tags.get(WRITER_TAG, "::0").partition(":")
    pid, _, ms = rest.partition(":")
    try:
        pid_n, ms_n = int(pid), float(ms)
    except ValueError:
        return True  # written before writers were tagged
    if time.time() * 1000 - ms_n > STALE_RUN_S * 1000:
        return True
    return host == socket.gethostname() and pid_n != os.getpid() and not spool.alive(pid_n)


def _mine(run) -> bool:
    """This process's own earlier attempt (it failed half-way and is being retried)."""
    host, _, rest = run.data.tags.get(WRITER_TAG, "").partition(":")
    return host == socket.gethostname() and rest.partition(":")[0] == str(os.getpid())


def _create(client: MlflowClient, exp_id: str, record: dict[str, Any], uri: str,
            adopt: Optional[str] = None) -> str:
    """A new run for ``record`` (or the adopted one), tagged with its result id and parent.
    After create_run, runs with the same result id are looked up again: when a concurrent
    writer made one too, the oldest is kept and the others deleted (exactly one per result)."""
    tags = dict(record["tags"], **{"fxtrack.result_id": record["result_id"],
                                   WRITER_TAG: _writer_tag()})
    parent_id = record.get("parent_result_id")
    if parent_id:
        parent = _parent_run(client, exp_id, parent_id, uri)
        if parent is not None:
            tags["mlflow.parentRunId"] = parent.info.run_id
    if adopt:  # `mlflow run` set its own user and source tags (type PROJECT): keep them
        tags = {k: v for k, v in tags.items()
                if not k.startswith(("mlflow.source.", "mlflow.user", "mlflow.git"))}
        tags["mlflow.runName"] = record["run_name"]
        client.log_batch(adopt, tags=[RunTag(k, str(v)) for k, v in tags.items()])
        return adopt
    run = client.create_run(exp_id, run_name=record["run_name"], tags=tags,
                            start_time=record.get("start_time_ms"))
    mine = run.info.run_id
    same = find_runs(client, exp_id, record["result_id"])
    keep = same[0].info.run_id if same else mine
    if keep != mine:
        client.delete_run(mine)  # another writer got there first: its run is the one
        raise TrackingUnavailable(f"run {keep} for this result was created concurrently by "
                                  "another process")
    return mine


def _parent_run(client: MlflowClient, exp_id: str, parent_id: str, uri: str):
    """The parent's run; if only its spool entry exists, it is delivered first, so the child
    keeps its link. A parent being delivered by another process: wait for it (retry later)."""
    parent = find_run(client, exp_id, parent_id)
    if parent is not None:
        return parent
    waiting = spool.find(parent_id)
    if waiting is None:
        return None  # the parent went elsewhere (or never existed): log the child unlinked
    claimed = spool.claim(waiting)
    if claimed is None:
        raise TrackingUnavailable(f"the sweep's parent run ({parent_id}) is being logged by "
                                  "another process; try again later")
    try:
        _log(claimed, spool.load(claimed), uri)
    except BaseException:
        spool.release(claimed)
        raise
    spool.remove(claimed)
    return find_run(client, exp_id, parent_id)


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
    """Params, tags and metrics in one ``log_batch`` (MLflow splits it within its limits).
    Metrics carry the record's end time; per-step points carry their own spooled times."""
    end = record.get("end_time_ms") or int(time.time() * 1000)
    params = [Param(k, str(v)[:6000]) for k, v in record.get("params", {}).items()]
    tags = [RunTag(k, str(v)[:5000]) for k, v in record.get("tags", {}).items()]
    metrics = [Metric(k, float(v), end, 0) for k, v in record.get("metrics", {}).items()]
    times = record.get("series_times_ms") or {}
    for key, values in record.get("series", {}).items():
        stamps = times.get(key) or [end] * len(values)
        metrics += [Metric(key, float(v), int(t), i) for i, (v, t) in enumerate(zip(values, stamps))]
    client.log_batch(run_id, metrics=metrics, params=params, tags=tags)


def deliver(entry: Path, uri: Optional[str] = None) -> str:
    """Claim a spool entry, log it, then clear it; on TrackingUnavailable it goes back to the
    spool. An entry another process holds raises TrackingUnavailable."""
    claimed = spool.claim(entry)
    if claimed is None:
        raise EntryBusy(f"{entry.name} is being uploaded by another process")
    try:
        run_id = log_entry(claimed, uri)
    except BaseException:
        spool.release(claimed)
        raise
    spool.remove(claimed)
    return run_id
