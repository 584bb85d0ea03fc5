"""Where runs are made, and the races of several writers on them: the one client per URI (a new
sqlite store migrated under a lock), the experiment got or created once, a result's run
created so that exactly one survives whoever writes it, and the dataset row two runs may both
insert."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, Optional

import mlflow
from filelock import FileLock
from mlflow.entities import Param, RunTag
from mlflow.tracking import MlflowClient

from fxtrack.tracking import spool
from fxtrack.tracking.artifacts import discard
from fxtrack.tracking.errors import TryAgain
from fxtrack.tracking.health import mlflow_defaults
from fxtrack.tracking.payload import Payload
from fxtrack.tracking.target import TrackingRejected

_CLIENTS: dict[str, MlflowClient] = {}  # one client (one HTTP session) per URI per process
_EXPERIMENTS: dict[tuple[str, str], str] = {}  # (uri, name) -> experiment id
# MLflow's UI opens an experiment without this tag in GenAI mode (traces, token usage); fxtrack's
# runs are model-training runs.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def client_for(uri: str) -> MlflowClient:
    """The client for ``uri``, one per process (one HTTP session: MLflow reads credentials from
    the environment at each request). A sqlite store is created and migrated once, under a file
    lock: several first runs at once otherwise race in alembic's migration and all but one crash."""
    client = _CLIENTS.get(uri)
    if client is None:
        mlflow_defaults()
        if uri.startswith("sqlite:///"):
            db = Path(uri[len("sqlite:///"):])
            db.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(f"{db}.lock", timeout=600):
                if not db.exists() or db.stat().st_size == 0:
                    _build_sqlite_store(db)
                _sqlite_store(uri)
        client = _CLIENTS[uri] = MlflowClient(uri)
    return client


def _sqlite_store(uri: str):
    """The embedded store with MLflow's default artifact root beside the database
    (``<db dir>/mlruns``, then ``<experiment id>/<run id>/artifacts``), whatever the cwd."""
    from mlflow.tracking._tracking_service.utils import _get_store

    root = _artifact_root(Path(uri[len("sqlite:///"):]))
    return _get_store(uri, artifact_uri=root)  # cached per (uri, root) by MLflow


def _artifact_root(db: Path) -> str:
    return (db.parent / "mlruns").as_uri()


def _build_sqlite_store(db: Path) -> None:
    """A new sqlite store built beside ``db`` and renamed onto it, whole: MLflow's ~100
    migrations each commit with a journal file and an fsync, seconds of wall per new store
    while other processes write (docs/measurements.md, 2026-12-08). The file under
    construction holds nothing yet, so it is built without the journal and fsyncs (SQLite's
    ``synchronous=OFF``, ``journal_mode=MEMORY``), synced once and renamed: a build cut short
    leaves no store, never a half-migrated one. Its connections are closed before the store
    opens under its own name with SQLite's defaults. Called under the store's lock."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    for stale in db.parent.glob(f".{db.name}.building-*"):  # a build killed before its rename
        stale.unlink(missing_ok=True)
    part = db.parent.absolute() / f".{db.name}.building-{os.getpid()}"
    part_uri = f"sqlite:///{part}"

    def unjournaled(dbapi_connection, _record) -> None:
        if Path(dbapi_connection.execute("PRAGMA database_list").fetchone()[2]) == part:
            dbapi_connection.execute("PRAGMA synchronous=OFF")
            dbapi_connection.execute("PRAGMA journal_mode=MEMORY")

    event.listen(Engine, "connect", unjournaled)
    try:
        try:
            SqlAlchemyStore(part_uri, _artifact_root(part))  # the store's own, beside it
        finally:  # the build's connections closed, whole or not
            event.remove(Engine, "connect", unjournaled)
            engine = SqlAlchemyStore._engine_map.pop(part_uri, None)
            if engine is not None:
                engine.dispose()
        _fsync(part)
        os.replace(part, db)
        _fsync(db.parent)
    finally:
        part.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def experiment_id(client: MlflowClient, name: str, uri: str) -> str:
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


def known_experiment(uri: str, name: Optional[str]) -> Optional[str]:
    """The id of experiment ``name`` at ``uri`` if this process has looked it up, else None."""
    return _EXPERIMENTS.get((uri, name))  # type: ignore[arg-type]


def ensure_kind(client: MlflowClient, exp_id: str, uri: str) -> None:
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


def create(client: MlflowClient, exp_id: str, record: dict[str, Any], payload: Payload,
           uri: str, parent_run: Callable[[str], Optional[str]],
           adopt: Optional[str] = None) -> tuple[str, Optional[str], bool]:
    """A new run for ``record`` (or the adopted one), tagged with its result id and its parent's
    run (``parent_run(parent result id)``: the run id, or None to log it unlinked):
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
        parent = parent_run(parent_id)
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
            discard(client, uri, other.info.run_id, other.info.artifact_uri)
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



def without_param_clashes(client: MlflowClient, run_id: str, payload: Payload) -> Payload:
    """An adopted run may already hold a param with another value (``mlflow run`` logs
    ``batch_size=null``; fxtrack resolved it to 256). MLflow params are immutable, so the
    resolved value goes under ``fxtrack.resolved.<key>``."""
    logged = client.get_run(run_id).data.params
    params = [Param(f"fxtrack.resolved.{p.key}" if p.key in logged and logged[p.key] != p.value
                    else p.key, p.value) for p in payload.params]
    return payload._replace(params=params)


_CONCURRENT_INSERT = ("IntegrityError", "UniqueViolation", "UNIQUE constraint failed",
                      "duplicate key value")


def log_inputs(client: MlflowClient, run_id: str, datasets: list, tries: int = 4) -> None:
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
