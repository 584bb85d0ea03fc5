"""The one MLflow writer: turns a spooled record into an MLflow run, exactly once.

A record is either a ``job`` (one benchmark run, logged whole) or a ``sweep`` (the parent run of
a multirun, created when the sweep starts and closed when it ends). Runs are found again by
their ``fxtrack.result_id`` tag, which makes logging idempotent: ``fxtrack sync`` may replay a
spool entry that was half-logged when the server went away.

This module composes the steps, each a module of its own: whether the server answers
(``health``), what an error means (``errors``: every delivery error is a TrackingUnavailable),
the record as MLflow takes it (``payload``), the run's files (``artifacts``), the run made once
whoever writes it (``runs``); and the spool entry claimed, delivered, cleared or set aside.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import mlflow
from mlflow.tracking import MlflowClient

from fxtrack.environment import redact_uri_text
from fxtrack.tracking import health, records, runs, spool
from fxtrack.tracking.artifacts import discard, log_model, model_files, upload
from fxtrack.tracking.errors import (EntryBusy, EntryInvalid, EntryStuck, ServerUnreachable,
                                     TryAgain, classify, unreachable)
from fxtrack.tracking.health import probe
from fxtrack.tracking.payload import Payload, load_entry, prepare
from fxtrack.tracking.runs import client_for, find_run
from fxtrack.tracking.target import (TrackingRejected, TrackingUnavailable, check_static,
                                     deleted_message)

_PARENTS: dict[tuple[str, str, str], str] = {}  # (uri, experiment id, result id) -> run id


def check_target(uri: str, experiment: str) -> None:
    """Before any work: the URI's scheme, the experiment name, the experiment not deleted, and
    under ``mlflow run`` the same server as the run it created. Raises TrackingRejected (fix
    it), or TrackingUnavailable (cannot tell now: the run goes ahead and is spooled)."""
    health.mlflow_defaults()  # what the processes it starts inherit, as from any writer call
    where = redact_uri_text(uri)
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


def log_entry(entry: Path, uri: Optional[str] = None) -> str:
    """Log one spool entry (to ``uri``, else the record's own); returns the run id.
    Raises TrackingUnavailable (or one of its kinds) when it cannot be logged now."""
    record, files = records.adopted(*load_entry(entry))
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
            health.mark_down(target, str(error))  # the next entries spool at once, till rechecked
        raise error from None
    health.answered(target)
    return run_id


def _log(record: dict[str, Any], payload: Payload, uri: str) -> str:
    client = client_for(uri)
    adopt = record.get("adopt_run_id")  # the run `mlflow run` created for this entry point
    if adopt:
        exp_id = client.get_run(adopt).info.experiment_id
    else:
        exp_id = (record.get("experiment_id")
                  or runs.experiment_id(client, record["experiment"], uri))
    if adopt or record.get("experiment_id"):  # made by `mlflow run`, not by fxtrack
        runs.ensure_kind(client, exp_id, uri)

    def parents(parent_id: str) -> Optional[str]:
        return _parent_run(client, exp_id, parent_id, uri)
    if record["kind"] == "sweep":
        existing = find_run(client, exp_id, record["result_id"])
        if existing is not None and existing.info.status != "RUNNING":
            if record.get("fallback"):  # its orchestrator closed it: the held word is moot
                return existing.info.run_id
            if record["status"] == "RUNNING":  # reopened (resume=true completes a group)
                client.update_run(existing.info.run_id, status="RUNNING")
        run_id, artifact_uri = (existing.info.run_id, existing.info.artifact_uri) if existing \
            else runs.create(client, exp_id, record, payload, uri, parents, adopt)[:2]
        if record["status"] != "RUNNING":
            client.log_batch(run_id, metrics=payload.metrics, params=payload.params,
                             tags=payload.tags)
            upload(client, run_id, uri, artifact_uri if run_id != adopt else None, payload.files)
            client.set_terminated(run_id, record["status"], end_time=record.get("end_time_ms"))
        _PARENTS[(uri, exp_id, record["result_id"])] = run_id  # its children need no search
        return run_id
    if adopt:
        existing = find_run(client, exp_id, record["result_id"])
        if existing is not None and existing.info.status != "RUNNING":
            return existing.info.run_id  # logged completely before: nothing to do
    # A new job's run is created first and checked for earlier runs of its result after: one
    # search per result instead of one before and one after (runs.create)
    run_id, artifact_uri, before = runs.create(client, exp_id, record, payload, uri, parents,
                                               adopt)
    if before:
        return run_id
    try:
        if adopt:
            payload = runs.without_param_clashes(client, adopt, payload)
        # params and metrics in as few requests as MLflow's batch limits allow (its client
        # splits them); the tags went with create_run
        client.log_batch(run_id, metrics=payload.metrics, params=payload.params)
        if payload.inputs:
            runs.log_inputs(client, run_id, list(payload.inputs))
        files, model, weights = model_files(record, payload.files)
        upload(client, run_id, uri, artifact_uri, files)
        if model is not None or weights is not None:
            try:
                log_model(uri, exp_id, run_id, model, weights)
            except Exception as e:  # noqa: BLE001 - a file MLflow's flavour refuses
                if unreachable(e) or isinstance(e, mlflow.exceptions.MlflowException):
                    raise  # the server's trouble: retry the whole run later
                folder = (model or weights).parent
                upload(client, run_id, uri, artifact_uri, [(folder.name, folder)])
        client.set_terminated(run_id, record["status"], end_time=record.get("end_time_ms"))
    except Exception as e:
        if run_id != adopt and not unreachable(e):
            try:  # no RUNNING leftover: the retry creates the run afresh
                discard(client, uri, run_id, artifact_uri)
            except Exception:  # noqa: BLE001, S110 - the re-check replaces it (_mine, _stale)
                pass
        raise
    return run_id


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


def deliver(entry: Path, uri: Optional[str] = None, hold: bool = False,
            written: Optional[tuple[dict[str, Any], list[tuple[str, Path | str]]]] = None) -> str:
    """Claim a spool entry, log it, then clear it; on TrackingUnavailable it goes back to the
    spool, on EntryInvalid it is set aside in ``bad/``. An entry another process holds raises
    EntryBusy; one the spool does not let us claim, EntryStuck.

    ``hold``: on ServerUnreachable keep the claim (``error.claimed``), so that this process,
    which may have left a RUNNING run of it, retries it after waiting (``deliver(claimed)``,
    then ``spool.release(claimed)`` if it gives up). ``written``: the (record, files) this
    process just spooled as ``entry``, logged as they are, not read back from it."""
    try:
        claimed = spool.claim(entry)
    except spool.SpoolError as e:
        raise EntryStuck(str(e)) from None
    if claimed is None:
        raise EntryBusy(f"{entry.name} is being uploaded by another process")
    try:
        run_id = (log_entry(claimed, uri) if written is None
                  else _deliver_record(*written, uri or written[0]["uri"]))
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
    shown = record.get("uri") or redact_uri_text(uri)
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
        # the entry is the guarantee (nothing lost if this process dies now); what is logged is
        # the record in hand, not the entry read back
        run_id = deliver(entry, uri, written=(record, list(artifacts.items())))
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
    exp_id = record.get("experiment_id") or runs.known_experiment(uri, record.get("experiment"))
    if exp_id is None:
        return ""
    from fxtrack.tracking.ui import run_link

    return f" at {run_link(redact_uri_text(uri), exp_id, run_id)}"
