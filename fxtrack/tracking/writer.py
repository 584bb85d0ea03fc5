"""The one MLflow writer: turns a spooled record into an MLflow run, exactly once.

A record is either a ``job`` (one benchmark run, logged whole) or a ``sweep`` (the parent run of
a multirun, created when the sweep starts and closed when it ends). Runs are found again by
their ``fxtrack.result_id`` tag, which makes logging idempotent: ``fxtrack sync`` may replay a
spool entry that was half-logged when the server went away.

Every delivery error ends as one of these exceptions, all TrackingUnavailable (the entry is not
in MLflow yet), classified by type and HTTP status (``MlflowException.get_http_status_code()``),
never by the text of a message:

- ``TrackingUnavailable``: the server or store is busy or failing (5xx, a locked database):
  retry later, the entry stays spooled;
- ``ServerUnreachable``: no connection at all (refused, reset, timed out): it may be restarting,
  a caller may wait for it (``wait_for``);
- ``TrackingRejected`` (4xx: bad credentials, no permission, a deleted experiment, a malformed
  URI): retrying cannot help, the message says what to fix;
- ``EntryInvalid`` (a TrackingRejected): the entry itself cannot be logged (a value that is no
  number, an unreadable artifact, a missing field); it is set aside in the spool's ``bad/``
  before anything reaches the server, so it never holds up the others;
- ``EntryBusy``: another process has claimed it; ``TryAgain``: another process is writing its
  run or its parent's, retry in seconds; ``EntryStuck``: the spool did not let us claim it
  (read-only, no permission).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple, Optional

from fxtrack.environment import redact_uri, redact_uri_text
from fxtrack.tracking import records, spool
from fxtrack.tracking.target import (  # noqa: F401 - writer.tracking_uri, writer.SCHEMES
    SCHEMES,
    TrackingRejected,
    TrackingUnavailable,
    check_static,
    deleted_message,
    tracking_uri,
)

# The MLflow UI's switch to its Model training layout (Runs table), kept on every link fxtrack writes.
# An unreachable server should cost seconds, not the minutes of MLflow's default back-off.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
# MLflow's "View run at" lines cost a get_run per closed run, on every result; fxtrack prints
# the run id itself.
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")

import mlflow  # noqa: E402
from filelock import FileLock  # noqa: E402
from mlflow.entities import Metric, Param, RunStatus, RunTag  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

# A server that accepts connections but never answers is found out by one /health request with
# this timeout (seconds), instead of MLflow's 3 x 15 s per request.
PROBE_TIMEOUT_S = float(os.environ.get("FXTRACK_PROBE_TIMEOUT_S", "5"))
# A server found unreachable is spooled for without trying for this long (s), then probed again:
# a sweep's later jobs see it come back after a restart instead of giving up for good.
DOWN_RECHECK_S = float(os.environ.get("FXTRACK_DOWN_RECHECK_S", "60"))
# A /health answer, or a run it just took whole, is trusted for this long (s): one probe per
# sync and after failures, not one per entry.
UP_FRESH_S = 30.0
_DOWN: dict[str, tuple[str, float]] = {}  # uri -> (why, when): spool at once until rechecked
_UP: dict[str, float] = {}  # uri -> when it last answered
_CLIENTS: dict[str, MlflowClient] = {}  # one client (one HTTP session) per URI per process
_EXPERIMENTS: dict[tuple[str, str], str] = {}  # (uri, name) -> experiment id
_PARENTS: dict[tuple[str, str, str], str] = {}  # (uri, experiment id, result id) -> run id
# MLflow's UI opens an experiment without this tag in GenAI mode (traces, token usage); fxtrack's
# runs are model-training runs.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


class ServerUnreachable(TrackingUnavailable):
    """No connection to the tracking server (refused, reset, timed out): down or restarting."""


class EntryInvalid(TrackingRejected):
    """The entry itself cannot be logged; ``set_aside`` is where it went (None: it could not be
    moved and stays in the spool)."""

    def __init__(self, message: str, set_aside: Optional[Path] = None) -> None:
        super().__init__(message)
        self.set_aside = set_aside


class EntryBusy(TrackingUnavailable):
    """Another process has claimed this spool entry and is uploading it."""


class TryAgain(TrackingUnavailable):
    """Another live process is writing this result's run or its parent's right now: retry in
    a few seconds (the entry is back in the spool)."""


class EntryStuck(TrackingUnavailable):
    """The spool does not let this process claim the entry (read-only, no permission)."""


def client_for(uri: str) -> MlflowClient:
    """The client for ``uri``, one per process (one HTTP session: MLflow reads credentials from
    the environment at each request). A sqlite store is created and migrated once, under a file
    lock: several first runs at once otherwise race in alembic's migration and all but one crash."""
    client = _CLIENTS.get(uri)
    if client is None:
        if uri.startswith("sqlite:///"):
            db = Path(uri[len("sqlite:///"):])
            db.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(f"{db}.lock", timeout=600):
                _sqlite_store(uri)
        client = _CLIENTS[uri] = MlflowClient(uri)
    return client


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
    check_static(uri, experiment)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        return  # a new embedded store: nothing to check, and checking must not create it
    probe(uri)
    try:
        exp = client_for(uri).get_experiment_by_name(experiment)
    except Exception as e:  # noqa: BLE001 - classified below
        raise classify(e, {"experiment": experiment, "uri": where}) from None
    if exp is not None and exp.lifecycle_stage == "deleted":
        raise TrackingRejected(deleted_message(experiment, where, exp.experiment_id))


def probe(uri: str) -> None:
    """For an HTTP server: one ``/health`` request with a short timeout, trusted for
    UP_FRESH_S; a server found down is not tried again for DOWN_RECHECK_S. Raises
    ServerUnreachable when it does not answer."""
    down = _DOWN.get(uri)
    if down and time.monotonic() - down[1] < DOWN_RECHECK_S:
        raise ServerUnreachable(down[0])
    if not uri.startswith(("http://", "https://")):
        return
    if time.monotonic() - _UP.get(uri, -UP_FRESH_S) < UP_FRESH_S:
        return
    _health(uri)


def _health(uri: str) -> None:
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S) as r:
            r.read(64)
    except urllib.error.HTTPError:
        pass  # it answers; the API calls will say what is wrong
    except Exception as e:  # noqa: BLE001 - refused, reset, timed out: all mean "not now"
        mark_down(uri, f"no answer from {redact_uri(uri)}/health within {PROBE_TIMEOUT_S:g} s "
                       f"({type(e).__name__})")
        raise ServerUnreachable(_DOWN[uri][0]) from None
    _DOWN.pop(uri, None)
    _UP[uri] = time.monotonic()
    _ANSWERED.add(uri)


_ANSWERED: set[str] = set()  # URIs that answered at least once in this process


def mark_down(uri: str, why: str) -> None:
    _DOWN[uri] = (why, time.monotonic())
    _UP.pop(uri, None)


def was_up(uri: str) -> bool:
    """Whether ``uri`` answered at least once in this process (so it is worth waiting for)."""
    return uri in _ANSWERED


def wait_for(uri: str, seconds: float, every_s: float = 2.0) -> bool:
    """Probe ``uri`` every ``every_s`` until it answers (True) or ``seconds`` pass (False)."""
    deadline = time.monotonic() + seconds
    while True:
        _DOWN.pop(uri, None)
        _UP.pop(uri, None)
        try:
            _health(uri)
            return True
        except ServerUnreachable:
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(every_s, left))


def classify(e: BaseException, record: dict[str, Any]) -> TrackingUnavailable:
    """Any delivery error as ServerUnreachable (no connection), TrackingRejected (HTTP 4xx:
    say what to fix) or TrackingUnavailable (anything else: retry later)."""
    if isinstance(e, TrackingUnavailable):
        return e
    if _unreachable(e):  # before the status: MLflow reports a refused connection as a 500
        return ServerUnreachable(f"cannot reach the tracking server at {record.get('uri')} "
                                 f"({_root_cause(e)}); it may be down or restarting")
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
    # e.g. sqlalchemy's OperationalError ("database is locked"): keep the entry, retry later.
    return TrackingUnavailable(f"{type(e).__name__}: {_first_line(e)}")


def _chain(e: Optional[BaseException]):
    seen: list[BaseException] = []
    while e is not None and not any(e is s for s in seen):
        seen.append(e)
        yield e
        e = e.__cause__ or e.__context__


def _unreachable(e: BaseException) -> bool:
    """No connection could be made or kept (refused, reset, DNS, timed out), by the exception
    types in its chain: MLflow wraps requests' errors in an MlflowException."""
    import requests

    for link in _chain(e):
        if isinstance(link, requests.exceptions.SSLError):
            return False  # a certificate problem: waiting cannot fix it
        if isinstance(link, (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                             ConnectionError, TimeoutError, socket.gaierror)):
            return True
    return False


def _root_cause(e: BaseException) -> str:
    last = list(_chain(e))[-1]
    text = getattr(last, "strerror", None) or _first_line(last)
    return f"{type(last).__name__}: {text}"


def _first_line(e: BaseException) -> str:
    text = (getattr(e, "message", None) or str(e)).strip()
    return redact_uri_text(text.splitlines()[0][:300]) if text else type(e).__name__


def _experiment_id(client: MlflowClient, name: str, uri: str) -> str:
    known = _EXPERIMENTS.get((uri, name))
    if known is not None:
        return known  # one lookup per sync, not one per entry
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            raise TrackingRejected(f"experiment {name!r} is deleted: restore it or choose "
                                   "another tracking.experiment")
        exp_id = exp.experiment_id
        for key, value in EXPERIMENT_KIND.items():  # made before fxtrack set it, or by hand
            if key not in exp.tags:
                client.set_experiment_tag(exp_id, key, value)
    else:
        try:
            if uri.startswith("sqlite:///"):
                from mlflow.entities import ExperimentTag

                exp_id = _sqlite_store(uri).create_experiment(
                    name, tags=[ExperimentTag(k, v) for k, v in EXPERIMENT_KIND.items()])
            else:
                exp_id = client.create_experiment(name, tags=EXPERIMENT_KIND)
        except mlflow.exceptions.MlflowException:  # created meanwhile by a concurrent process
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            exp_id = exp.experiment_id
    _EXPERIMENTS[(uri, name)] = exp_id
    return exp_id


_KIND_CHECKED: set[tuple[str, str]] = set()  # (uri, experiment id) known to carry the kind


def _ensure_kind(client: MlflowClient, exp_id: str, uri: str) -> None:
    """EXPERIMENT_KIND on an experiment given by id, checked once per process."""
    if (uri, exp_id) in _KIND_CHECKED:
        return
    tags = client.get_experiment(exp_id).tags
    for key, value in EXPERIMENT_KIND.items():
        if key not in tags:
            client.set_experiment_tag(exp_id, key, value)
    _KIND_CHECKED.add((uri, exp_id))


def find_runs(client: MlflowClient, experiment_id: str, result_id: str) -> list:
    """Every run carrying ``result_id``, oldest first."""
    runs = client.search_runs([experiment_id], f"tags.`fxtrack.result_id` = '{result_id}'",
                              max_results=50, order_by=["attributes.start_time ASC"])
    return sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))


def find_run(client: MlflowClient, experiment_id: str, result_id: str):
    runs = find_runs(client, experiment_id, result_id)
    return runs[0] if runs else None


class Payload(NamedTuple):
    """What a record sends, checked and converted before anything reaches the server."""
    params: list[Param]
    tags: list[RunTag]
    metrics: list[Metric]
    files: list[tuple[str, Path | str]]  # artifact name -> file to upload, or its text
    inputs: tuple = ()  # mlflow.entities.DatasetInput: what the run read


_REQUIRED = ("kind", "result_id", "run_name", "status")


def prepare(record: dict[str, Any], files: list[tuple[str, Path | str]]) -> Payload:
    """The record's params, tags, metrics and artifacts as MLflow takes them. Raises
    EntryInvalid (the entry's own fault: no retry can help) for a missing field, a value that
    is no number, a name MLflow refuses, an artifact that cannot be read."""
    missing = [key for key in _REQUIRED if not record.get(key)]
    if not (record.get("experiment") or record.get("experiment_id") or record.get("adopt_run_id")):
        missing.append("experiment")
    if missing:
        raise EntryInvalid(f"the record has no {', '.join(missing)}")
    if record["kind"] not in ("job", "sweep"):
        raise EntryInvalid(f"the record's kind {record['kind']!r} is neither 'job' nor 'sweep'")
    try:
        RunStatus.from_string(record["status"])
    except Exception:  # noqa: BLE001 - MLflow raises a bare Exception for an unknown status
        raise EntryInvalid(f"the record's status {record['status']!r} is not an MLflow run "
                           "status") from None
    end = record.get("end_time_ms") or int(time.time() * 1000)
    try:
        params = [Param(str(k), str(v)[:6000]) for k, v in (record.get("params") or {}).items()]
        tags = [RunTag(str(k), str(v)[:5000]) for k, v in (record.get("tags") or {}).items()]
        metrics = [Metric(str(k), _number(k, v), int(end), 0)
                   for k, v in (record.get("metrics") or {}).items()]
        times = record.get("series_times_ms") or {}
        for key, values in (record.get("series") or {}).items():
            stamps = times.get(key) or [end] * len(values)
            metrics += [Metric(str(key), _number(key, v), int(t), i)
                        for i, (v, t) in enumerate(zip(values, stamps))]
    except (AttributeError, TypeError, ValueError) as e:
        raise EntryInvalid(f"the record is malformed ({type(e).__name__}: {e})") from None
    _check_names(params, tags, metrics)
    inputs = _datasets(record.get("inputs") or [])
    readable: list[tuple[str, Path | str]] = []
    for name, content in files:
        try:
            if isinstance(content, Path) and content.is_file():
                with open(content, "rb") as f:
                    f.read(1)
            elif isinstance(content, Path) and not content.is_dir():
                continue  # a file the run never wrote (spool.write skips it too)
        except OSError as e:
            raise EntryInvalid(f"artifact {name} cannot be read ({type(e).__name__}: "
                               f"{e.strerror or e})") from None
        readable.append((name, content))
    return Payload(params, tags, metrics, readable, tuple(inputs))


def _datasets(inputs: list[dict[str, Any]]) -> list:
    """The record's ``inputs`` (records.dataset_input) as MLflow's dataset inputs, the context
    (training | inference) as MLflow's own input tag."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    try:
        return [DatasetInput(Dataset(d["name"], d["digest"], d["source_type"], d["source"],
                                     d.get("schema"), d.get("profile")),
                             [InputTag(MLFLOW_DATASET_CONTEXT, d["context"])] if d.get("context")
                             else []) for d in inputs]
    except (KeyError, TypeError) as e:
        raise EntryInvalid(f"the record's inputs are malformed ({type(e).__name__}: {e})") from None


def _number(key: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise EntryInvalid(f"metric {key!r} is not a number: {value!r:.80}") from None


def _check_names(params: list[Param], tags: list[RunTag], metrics: list[Metric]) -> None:
    """MLflow's own name rules, applied here so that a bad name sets the entry aside instead of
    failing half-way through a run on the server."""
    from mlflow.utils import validation

    try:
        for p in params:
            validation._validate_param_name(p.key)
        for t in tags:
            validation._validate_tag_name(t.key)
        for m in {m.key for m in metrics}:
            validation._validate_metric_name(m)
    except mlflow.exceptions.MlflowException as e:
        raise EntryInvalid(f"MLflow refuses a name in the record: {_first_line(e)}") from None


def load_entry(entry: Path) -> tuple[dict[str, Any], list[tuple[str, Path | str]]]:
    """A claimed entry's record and artifact files; EntryInvalid if they cannot be read."""
    try:
        return spool.load(entry), list(spool.artifacts(entry))
    except (OSError, ValueError, AttributeError) as e:
        raise EntryInvalid(f"unreadable entry: {type(e).__name__}: {e}") from None


def log_entry(entry: Path, uri: Optional[str] = None) -> str:
    """Log one spool entry (to ``uri``, else the record's own); returns the run id.
    Raises TrackingUnavailable (or one of its kinds) when it cannot be logged now."""
    record, files = load_entry(entry)
    return _deliver_record(record, files, uri or record["uri"])


def _deliver_record(record: dict[str, Any], files: list[tuple[str, Path | str]],
                    target: str) -> str:
    payload = prepare(record, files)  # the entry's own faults, before any request
    try:
        probe(target)
        run_id = _log(record, payload, target)
    except Exception as e:  # noqa: BLE001 - every delivery error is classified, none crashes
        error = classify(e, record)
        if isinstance(error, ServerUnreachable) and not isinstance(e, TrackingUnavailable) and \
                target.startswith(("http://", "https://")):
            mark_down(target, str(error))  # the next entries spool at once until rechecked
        raise error from None
    if target in _UP:  # it just answered every request of a run: as good as a /health probe
        _UP[target] = time.monotonic()
    return run_id


def _log(record: dict[str, Any], payload: Payload, uri: str) -> str:
    client = client_for(uri)
    adopt = record.get("adopt_run_id")  # the run `mlflow run` created for this entry point
    if adopt:
        exp_id = client.get_run(adopt).info.experiment_id
    else:
        exp_id = record.get("experiment_id") or _experiment_id(client, record["experiment"], uri)
    if adopt or record.get("experiment_id"):  # made by `mlflow run`, not by fxtrack
        _ensure_kind(client, exp_id, uri)
    if record["kind"] == "sweep":
        existing = find_run(client, exp_id, record["result_id"])
        run_id, artifact_uri = (existing.info.run_id, existing.info.artifact_uri) if existing \
            else _create(client, exp_id, record, payload, uri, adopt)[:2]
        if record["status"] != "RUNNING":
            client.log_batch(run_id, metrics=payload.metrics, params=payload.params,
                             tags=payload.tags)
            _upload(client, run_id, uri, artifact_uri if run_id != adopt else None, payload.files)
            client.set_terminated(run_id, record["status"], end_time=record.get("end_time_ms"))
        _PARENTS[(uri, exp_id, record["result_id"])] = run_id  # its children need no search
        return run_id
    if adopt:
        existing = find_run(client, exp_id, record["result_id"])
        if existing is not None and existing.info.status != "RUNNING":
            return existing.info.run_id  # logged completely before: nothing to do
    # A new job's run is created first and checked for earlier runs of its result after: one
    # search per result instead of one before and one after (_create)
    run_id, artifact_uri, before = _create(client, exp_id, record, payload, uri, adopt)
    if before:
        return run_id
    try:
        if adopt:
            payload = _without_param_clashes(client, adopt, payload)
        # params and metrics in as few requests as MLflow's batch limits allow (its client
        # splits them); the tags went with create_run
        client.log_batch(run_id, metrics=payload.metrics, params=payload.params)
        if payload.inputs:
            _log_inputs(client, run_id, list(payload.inputs))
        files, model = _model_files(record, payload.files)
        _upload(client, run_id, uri, artifact_uri, files)
        if model is not None:
            try:
                _log_model(uri, exp_id, run_id, model)
            except Exception as e:  # noqa: BLE001 - a file MLflow's flavour refuses
                if _unreachable(e) or isinstance(e, mlflow.exceptions.MlflowException):
                    raise  # the server's trouble: retry the whole run later
                _upload(client, run_id, uri, artifact_uri, [(model.parent.name, model.parent)])
        client.set_terminated(run_id, record["status"], end_time=record.get("end_time_ms"))
    except Exception as e:
        if run_id != adopt and not _unreachable(e):
            try:  # no RUNNING leftover: the retry creates the run afresh
                _discard(client, uri, run_id, artifact_uri)
            except Exception:  # noqa: BLE001, S110 - the re-check replaces it (_mine, _stale)
                pass
        raise
    return run_id


_CONCURRENT_INSERT = ("IntegrityError", "UniqueViolation", "UNIQUE constraint failed",
                      "duplicate key value")


def _log_inputs(client: MlflowClient, run_id: str, datasets: list, tries: int = 4) -> None:
    """log_inputs, again when it lost a race: the server gets-or-creates the dataset row in two
    steps, so two runs of one experiment logging the same dataset at once can both try to insert
    it, and the loser's error (HTTP 400, a unique-constraint violation) is not the run's fault;
    the next try finds the row the winner made."""
    for attempt in range(tries):
        try:
            return client.log_inputs(run_id, datasets=datasets)
        except mlflow.exceptions.MlflowException as e:
            if attempt == tries - 1 or not any(m in str(e) for m in _CONCURRENT_INSERT):
                raise
            time.sleep(0.2 * (attempt + 1))


def _model_files(record: dict[str, Any], files: list[tuple[str, Path | str]]):
    """The artifacts less the logged model's folder, and the model file in it (None: no model,
    or its flavour is not in MLflow: the folder goes up as a plain artifact)."""
    spec = record.get("logged_model")
    if not spec or not spec.get("flavor"):
        return files, None
    folder = dict(files).get(spec["artifact"])
    if not isinstance(folder, Path) or not (folder / spec["file"]).is_file():
        return files, None
    return [f for f in files if f[0] != spec["artifact"]], folder / spec["file"]


def _log_model(uri: str, exp_id: str, run_id: str, path: Path) -> None:
    """Log a deployment run's ONNX artefact as an MLflow logged model (``mlflow.onnx``; records.
    MODEL_FLAVORS) of the run, so the run's Models tab lists it with the run's metrics (latency
    included). MLflow's model API logs through the global tracking URI and puts the model in the
    active experiment: both pointed at this run's for this call only."""
    import mlflow.onnx
    import onnx
    from mlflow.models import Model

    previous = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    previous_exp = os.environ.get("MLFLOW_EXPERIMENT_ID")
    mlflow.set_tracking_uri(uri)
    os.environ["MLFLOW_EXPERIMENT_ID"] = exp_id
    try:
        Model.log(artifact_path=None, name="model", flavor=mlflow.onnx, run_id=run_id,
                  onnx_model=onnx.load(str(path)))  # its external data, beside it, too
    finally:
        if previous:
            mlflow.set_tracking_uri(previous)
        if previous_exp is None:
            os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
        else:
            os.environ["MLFLOW_EXPERIMENT_ID"] = previous_exp


def _upload(client: MlflowClient, run_id: str, uri: str, artifact_uri: Optional[str],
            files: list[tuple[str, Path | str]]) -> None:
    """Each artifact once, straight to the run's artifact location (no get_run per file);
    texts and renamed files go through a temporary directory."""
    if not files:
        return
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    repo = get_artifact_repository(artifact_uri, tracking_uri=uri) if artifact_uri else None
    tmp: Optional[Path] = None
    try:
        for name, content in files:
            if not (isinstance(content, Path) and content.name == name):
                tmp = tmp or Path(tempfile.mkdtemp(prefix="fxtrack-upload-"))
                path = tmp / name
                if isinstance(content, Path):
                    shutil.copyfile(content, path)
                else:
                    path.write_text(content)
                content = path
            if repo is None and content.is_dir():
                client.log_artifacts(run_id, str(content), name)
            elif repo is None:
                client.log_artifact(run_id, str(content))
            elif content.is_dir():
                repo.log_artifacts(str(content), name)
            else:
                repo.log_artifact(str(content))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _discard(client: MlflowClient, uri: str, run_id: str, artifact_uri: Optional[str]) -> None:
    """Delete a run and its artifacts (MLflow's delete_run keeps them until `mlflow gc`)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    try:
        if artifact_uri:
            get_artifact_repository(artifact_uri, tracking_uri=uri).delete_artifacts()
    except Exception:  # noqa: BLE001, S110 - a leftover folder costs disk space, never a result
        pass
    client.delete_run(run_id)


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


def _create(client: MlflowClient, exp_id: str, record: dict[str, Any], payload: Payload,
            uri: str, adopt: Optional[str] = None) -> tuple[str, Optional[str], bool]:
    """A new run for ``record`` (or the adopted one), tagged with its result id and parent:
    (run id, its artifact location or None for an adopted run, whether the result was logged
    completely before). After create_run the runs with the same result id are looked up, once:

    - one that is finished (FINISHED, FAILED, KILLED: closed only once everything was logged)
      is the result's run: ours is deleted and that one returned;
    - a RUNNING one whose writer is gone (_stale) or was this process (_mine) is a half-logged
      attempt: deleted with its artifacts;
    - a RUNNING one of another live writer that began its attempt before ours wins: ours is
      deleted (TryAgain); ours began first: the other writer deletes its own on its own check.

    So exactly one run per result survives, whoever writes it."""
    tags = {t.key: t.value for t in payload.tags}
    tags.update({"fxtrack.result_id": record["result_id"], WRITER_TAG: _writer_tag()})
    parent_id = record.get("parent_result_id")
    if parent_id:
        parent = _parent_run(client, exp_id, parent_id, uri)
        if parent is not None:
            tags["mlflow.parentRunId"] = parent
    if adopt:  # `mlflow run` set its own user and source tags (type PROJECT): keep them
        tags = {k: v for k, v in tags.items()
                if not k.startswith(("mlflow.source.", "mlflow.user", "mlflow.git"))}
        tags["mlflow.runName"] = record["run_name"]
        client.log_batch(adopt, tags=[RunTag(k, str(v)) for k, v in tags.items()])
        return adopt, None, False
    run = client.create_run(exp_id, run_name=record["run_name"], tags=tags,
                            start_time=record.get("start_time_ms"))
    mine = run.info.run_id
    others = [r for r in find_runs(client, exp_id, record["result_id"])
              if r.info.run_id != mine]
    done = [r for r in others if r.info.status != "RUNNING"]
    if done:
        client.delete_run(mine)  # nothing was logged into it yet: no artifacts to remove
        return done[0].info.run_id, done[0].info.artifact_uri, True
    live = []
    for other in others:
        if _stale(other) or _mine(other):
            _discard(client, uri, other.info.run_id, other.info.artifact_uri)
        else:
            live.append(other)
    first = min(live, key=_attempt_order, default=None)
    if first is not None and _attempt_order(first) < (_attempt_ms(tags[WRITER_TAG]), mine):
        client.delete_run(mine)  # another writer got there first: its run is the one
        raise TryAgain(f"run {first.info.run_id} for this result is being written by another "
                       "process; try again later")
    return mine, run.info.artifact_uri, False


def _attempt_ms(writer: str) -> float:
    try:
        return float(writer.rsplit(":", 1)[-1])
    except ValueError:
        return 0.0


def _attempt_order(run) -> tuple[float, str]:
    """When a run's attempt began (its writer tag), then its id: of two live writers of one
    result, the earlier attempt keeps its run, so a writer's retry never displaces a run in
    progress (the runs' start times are the result's, the same for every attempt)."""
    return _attempt_ms(run.data.tags.get(WRITER_TAG, "")), run.info.run_id


def _parent_run(client: MlflowClient, exp_id: str, parent_id: str, uri: str) -> Optional[str]:
    """The parent's run id (looked up once per process); if only its spool entry exists, it is
    delivered first, so the child keeps its link. A parent being delivered by another process:
    wait for it (retry later)."""
    key = (uri, exp_id, parent_id)
    if key in _PARENTS:
        return _PARENTS[key]
    parent = find_run(client, exp_id, parent_id)
    if parent is not None:
        _PARENTS[key] = parent.info.run_id
        return parent.info.run_id
    waiting = spool.find(parent_id)
    if waiting is None:
        return None  # the parent went elsewhere (or never existed): log the child unlinked
    try:
        claimed = spool.claim(waiting)
    except spool.SpoolError as e:
        raise EntryStuck(f"the sweep's parent entry cannot be claimed: {e}") from None
    if claimed is None:
        raise TryAgain(f"the sweep's parent run ({parent_id}) is being logged by another "
                       "process; try again later")
    try:
        record, files = load_entry(claimed)
        run_id = _log(record, prepare(record, files), uri)
    except EntryInvalid as e:
        _set_aside(claimed, e)  # the parent cannot be logged: the child goes unlinked
        return None
    except BaseException:
        spool.release(claimed)
        raise
    spool.remove(claimed)
    _PARENTS[key] = run_id
    return run_id


def _without_param_clashes(client: MlflowClient, run_id: str, payload: Payload) -> Payload:
    """An adopted run may already hold a param with another value (``mlflow run`` logs
    ``batch_size=null``; fxtrack resolved it to 256). MLflow params are immutable, so the
    resolved value goes under ``fxtrack.resolved.<key>``."""
    logged = client.get_run(run_id).data.params
    params = [Param(f"fxtrack.resolved.{p.key}" if p.key in logged and logged[p.key] != p.value
                    else p.key, p.value) for p in payload.params]
    return payload._replace(params=params)


def deliver(entry: Path, uri: Optional[str] = None, hold: bool = False) -> str:
    """Claim a spool entry, log it, then clear it; on TrackingUnavailable it goes back to the
    spool, on EntryInvalid it is set aside in ``bad/``. An entry another process holds raises
    EntryBusy; one the spool does not let us claim, EntryStuck.

    ``hold``: on ServerUnreachable keep the claim (``error.claimed``), so that this process,
    which may have left a RUNNING run of it, retries it after waiting (``deliver(claimed)``,
    then ``spool.release(claimed)`` if it gives up)."""
    try:
        claimed = spool.claim(entry)
    except spool.SpoolError as e:
        raise EntryStuck(str(e)) from None
    if claimed is None:
        raise EntryBusy(f"{entry.name} is being uploaded by another process")
    try:
        run_id = log_entry(claimed, uri)
    except EntryInvalid as e:
        raise _set_aside(claimed, e) from None
    except ServerUnreachable as e:
        if hold:
            e.claimed = claimed  # type: ignore[attr-defined]
        else:
            spool.release(claimed)
        raise
    except BaseException:
        spool.release(claimed)
        raise
    spool.remove(claimed)
    return run_id


def _set_aside(claimed: Path, error: EntryInvalid) -> EntryInvalid:
    """Move a claimed entry that cannot be logged to ``bad/`` with its reason; if even that
    fails (a read-only or full spool), give it back and say both."""
    try:
        where = spool.quarantine(claimed, str(error))
    except spool.SpoolError as e:
        spool.release(claimed)
        return EntryInvalid(f"{error}; and it could not be set aside ({e}), so it stays in the "
                            "spool")
    return EntryInvalid(str(error), where)


def log_record(record: dict[str, Any], artifacts: dict[str, Path | str],
               uri: str) -> tuple[Optional[str], str, Optional[str]]:
    """Spool ``record`` with ``artifacts`` (name -> file or text), then deliver it to ``uri``:
    the orchestrator's one call. Returns (run id or None, where it went, a message for the
    terminal or None). A result that cannot be spooled (a full or read-only disk) is still
    delivered directly; if that fails too, the message says it is lost and what survives."""
    name = record.get("run_name") or record.get("result_id")
    shown = record.get("uri") or redact_uri(uri)
    try:
        entry = spool.write(record, artifacts)
    except spool.SpoolError as spool_error:
        try:
            run_id = _deliver_record(record, list(artifacts.items()), uri)
        except TrackingUnavailable as e:
            left = [str(p) for p in artifacts.values() if isinstance(p, Path) and p.is_file()]
            return None, "LOST", (
                f"fxtrack: the result of {name} is LOST: it could not be spooled ({spool_error}) "
                f"nor logged to {shown} ({e})"
                + (f"; still on disk: {', '.join(left)}" if left else ""))
        return run_id, f"mlflow run {run_id}, not spooled", (
            f"fxtrack: could not spool the result of {name} ({spool_error}); it was logged "
            f"directly to {shown} as run {run_id}")
    try:
        run_id = deliver(entry, uri)
    except EntryInvalid as e:
        return None, "set aside", (
            f"fxtrack: the result of {name} cannot be logged: {e}\n"
            f"fxtrack: it is kept in {e.set_aside or entry}")
    except TrackingRejected as e:
        return None, "spooled", (
            f"fxtrack: {shown} refused the run: {e}\n"
            f"fxtrack: the result is kept in {entry}; fix that, then run `fxtrack sync`")
    except TrackingUnavailable as e:
        return None, "spooled", (
            f"fxtrack: could not log to {shown}: {e}\n"
            f"fxtrack: the result is kept in {entry}: {records.sync_advice(uri)}")
    return run_id, f"mlflow run {run_id}" + _ui_link(uri, record, run_id), None


def _ui_link(uri: str, record: dict[str, Any], run_id: Optional[str]) -> str:
    """`` at <run page>`` where the tracking URI is a server (its UI serves the run there), with
    workflowType=machine_learning: without it the MLflow UI opens its GenAI layout."""
    if not run_id or not uri.startswith(("http://", "https://")):
        return ""
    exp_id = record.get("experiment_id") or _EXPERIMENTS.get((uri, record.get("experiment")))
    if exp_id is None:
        return ""
    from fxtrack.tracking.ui import run_link

    return f" at {run_link(redact_uri(uri), exp_id, run_id)}"
