"""Read runs back out of MLflow as one DataFrame, for the report.

The frame has the layout of ``mlflow.search_runs``: ``run_id``, ``experiment_id``, ``status``,
``artifact_uri``, ``start_time``, ``end_time`` (UTC timestamps), then ``metrics.<key>``,
``params.<key>`` and ``tags.<key>`` columns. It is built from ``MlflowClient(uri).search_runs``
page by page rather than from the fluent ``mlflow.search_runs``, because the fluent call reads
the process-wide tracking URI and stops at ``max_results``; a client bound to ``uri`` changes no
global state and reads every page.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import mlflow
import pandas as pd
from mlflow.tracking import MlflowClient

from fxtrack.environment import redact_uri_text
from fxtrack.tracking.errors import corrupt_store
from fxtrack.tracking.health import mlflow_defaults

_PAGE = 1000  # runs per search request; the file and SQL stores cap pages at 50,000


class ReadError(RuntimeError):
    """Runs could not be read; the message is one line, fit to show a user as it is."""


class ExperimentNotFound(ReadError):
    """The experiment (or the sqlite store holding it) does not exist."""


class NoRunsFound(ReadError):
    """The experiment exists but has no runs, or none that match the filter."""


class InvalidFilter(ReadError):
    """MLflow rejected the filter string."""


def load_runs(uri: str, experiment: str, filter_string: Optional[str] = None) -> pd.DataFrame:
    """Every active run of ``experiment`` at ``uri`` matching ``filter_string``, all pages.

    Raises ExperimentNotFound, NoRunsFound, InvalidFilter, or ReadError (store unreachable).
    """
    where = redact_uri_text(uri)
    _require_sqlite_file(uri, experiment)
    mlflow_defaults()  # a server that is down fails the read in seconds, as it fails a write
    try:
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(experiment)
    except Exception as e:  # noqa: BLE001 - a damaged store is said as such, the rest below
        damaged = corrupt_store(e, uri)
        if damaged:
            raise ReadError(damaged) from e
        _read_error(e, where)
    active = exp is not None and exp.lifecycle_stage != "deleted"
    projects = _project_runs(client, exp.experiment_id if active else None, experiment,
                             filter_string or "", where)
    if not active and not projects:
        raise ExperimentNotFound(f"experiment {experiment!r} does not exist at {where}")
    runs = (_all_pages(client, exp.experiment_id, filter_string or "", where) if active else [])
    runs += projects
    if not runs:
        if filter_string:
            raise NoRunsFound(f"no runs of experiment {experiment!r} match the filter "
                              f"{filter_string!r}")
        raise NoRunsFound(f"experiment {experiment!r} at {where} has no runs yet")
    return pd.DataFrame([_row(run) for run in runs])


def _read_error(e: Exception, where: str) -> None:
    """``e`` as the ReadError that says it (re-raised as it is when it is no read error)."""
    if isinstance(e, mlflow.exceptions.MlflowException):
        raise ReadError(f"cannot read {where}: {_first_line(e)}") from e
    if isinstance(e, (OSError, ConnectionError)):
        raise ReadError(f"cannot reach {where}: {type(e).__name__}: "
                        f"{redact_uri_text(str(e))}") from e
    raise e


def _existing(uri: str, experiment: str) -> tuple[Optional[MlflowClient], Any]:
    """(a client, ``experiment``) where the store and the experiment exist; (None, None) where
    a sqlite store is not there yet (looking must not create it), (client, None) where the
    experiment is not."""
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        return None, None
    mlflow_defaults()
    client = MlflowClient(uri)
    return client, client.get_experiment_by_name(experiment)


def finished_run(uri: str, experiment: str, config_id: str) -> Optional[str]:
    """The id of a FINISHED run of ``config_id`` (tag ``fxtrack.config_id``) in ``experiment``,
    or None (no store yet: nothing is created)."""
    client, exp = _existing(uri, experiment)
    if exp is None:
        return None
    found = client.search_runs([exp.experiment_id], f"tags.`fxtrack.config_id` = '{config_id}' "
                               "and attributes.status = 'FINISHED'", max_results=1)
    return found[0].info.run_id if found else None


def repeat_group(uri: str, experiment: str, config_id: str) -> Optional[dict[str, Any]]:
    """The latest repeat group of ``config_id`` (runs tagged ``fxtrack.repeat_of``), for
    ``resume=true``: ``{"aggregate": its result id, "status": the aggregate run's status (None
    if it was never logged), "done": {repeat index: entry}}`` with an entry per FINISHED repeat
    (``name``, ``status``, ``guard``, ``metrics``, ``tags``, ``params``, ``run_id``: as a
    sweep's job file has them). None: no group yet (no store: nothing is created)."""
    client, exp = _existing(uri, experiment)
    if exp is None:
        return None
    found = [r for r in client.search_runs([exp.experiment_id],
                                           f"tags.`fxtrack.config_id` = '{config_id}'",
                                           max_results=5000)
             if r.data.tags.get("fxtrack.repeat_of")]
    if not found:
        return None
    latest = max(found, key=lambda r: r.info.start_time or 0).data.tags["fxtrack.repeat_of"]
    done: dict[int, dict[str, Any]] = {}
    for run in sorted(found, key=lambda r: r.info.start_time or 0):  # the latest of an index wins
        tags = run.data.tags
        if tags["fxtrack.repeat_of"] != latest or run.info.status != "FINISHED" \
                or not tags.get("fxtrack.repeat", "").isdigit():
            continue
        done[int(tags["fxtrack.repeat"])] = {
            "name": tags.get("mlflow.runName", run.info.run_id), "status": "FINISHED",
            "guard": tags.get("fxtrack.guard", "ok"), "error": "", "metrics": run.data.metrics,
            "tags": tags, "params": run.data.params, "run_id": run.info.run_id}
    from fxtrack.tracking.runs import find_run

    aggregate = find_run(client, exp.experiment_id, latest)
    return {"aggregate": latest, "status": aggregate.info.status if aggregate else None,
            "done": done}


def experiment_names(uri: str) -> list[str]:
    """The active experiments at ``uri``, sorted; empty when the store cannot be read (or, for
    sqlite, does not exist: listing must not create it)."""
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        return []
    mlflow_defaults()
    try:
        return sorted(e.name for e in MlflowClient(uri).search_experiments())
    except (mlflow.exceptions.MlflowException, OSError, ConnectionError):
        return []


DEFAULT_EXPERIMENT = "fxtrack"
_PROJECT = "tags.`mlflow.source.type` = 'PROJECT'"


def _project_runs(client: MlflowClient, skip_id: Optional[str], experiment: str,
                  filter_string: str, where: str) -> list:
    """fxtrack runs that ``mlflow run`` made in other experiments (it logs into the experiment
    it was given, by default MLflow's 'Default'): part of the default experiment's report."""
    if experiment != DEFAULT_EXPERIMENT:
        return []
    try:
        ids = [e.experiment_id for e in client.search_experiments()
               if e.experiment_id != skip_id]
    except (mlflow.exceptions.MlflowException, OSError, ConnectionError):
        return []  # the main search reports what is wrong with the store
    if not ids:
        return []
    query = f"{filter_string} and {_PROJECT}" if filter_string else _PROJECT
    return [r for r in _all_pages(client, ids, query, where)
            if r.data.tags.get("fxtrack.framework")]


def _require_sqlite_file(uri: str, experiment: str) -> None:
    # MLflow would create an empty database at a mistyped path; reading must not write.
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
        if not path.is_file():
            raise ExperimentNotFound(f"experiment {experiment!r} does not exist: no MLflow "
                                     f"database at {path}")


def _all_pages(client: MlflowClient, experiment_id: "str | list[str]", filter_string: str,
               where: str) -> list:
    ids = experiment_id if isinstance(experiment_id, list) else [experiment_id]
    runs: list = []
    token = None
    while True:
        try:
            page = client.search_runs(ids, filter_string, max_results=_PAGE,
                                      page_token=token)
        except mlflow.exceptions.MlflowException as e:
            if e.error_code == "INVALID_PARAMETER_VALUE" and filter_string:
                raise InvalidFilter(f"invalid filter {filter_string!r}: {_first_line(e)}") from e
            raise ReadError(f"cannot search runs at {where}: {_first_line(e)}") from e
        except (OSError, ConnectionError) as e:
            raise ReadError(f"cannot reach {where}: {type(e).__name__}: "
                            f"{redact_uri_text(str(e))}") from e
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _row(run) -> dict[str, Any]:
    """One run as a flat dict in ``mlflow.search_runs``' column layout."""
    info, data = run.info, run.data
    row: dict[str, Any] = {
        "run_id": info.run_id, "experiment_id": info.experiment_id, "status": info.status,
        "artifact_uri": info.artifact_uri,
        "start_time": pd.to_datetime(info.start_time, unit="ms", utc=True),
        "end_time": pd.to_datetime(info.end_time, unit="ms", utc=True),
    }
    row.update({f"metrics.{k}": v for k, v in data.metrics.items()})
    row.update({f"params.{k}": v for k, v in data.params.items()})
    row.update({f"tags.{k}": v for k, v in data.tags.items()})
    return row


def _first_line(e: Exception) -> str:
    text = getattr(e, "message", None) or str(e)
    # Server errors may quote the URI they were sent to, credentials included.
    return redact_uri_text(text.strip().splitlines()[0][:300]) if text.strip() else type(e).__name__


def metric_histories(uri: str, run_ids: list[str],
                     keys: list[str]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """run id -> key -> its (step, value) points, in step order (a series logged at chosen
    steps: scenario=converge's eval history); a key a run did not log is left out."""
    client = MlflowClient(uri)
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for run_id in run_ids:
        for key in keys:
            try:
                points = client.get_metric_history(run_id, key)
            except mlflow.exceptions.MlflowException as e:
                raise ReadError(f"cannot read {key} of run {run_id}: {_first_line(e)}") from e
            if points:
                out.setdefault(run_id, {})[key] = sorted((p.step, p.value) for p in points)
    return out
