"""The checks of a tracking target that need no MLflow: the URI's scheme, the experiment's name,
and for an embedded sqlite store whether the experiment is deleted, read straight from the
database. A run makes them before its worker starts; MLflow itself (~2-3 s to import and open a
store on a 2-core machine) is then loaded while the worker imports its framework."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Optional
from urllib.parse import quote, urlsplit

from fxtrack.environment import move_uri_credentials, redact_uri_text

SCHEMES = ("http", "https", "sqlite", "file", "postgresql", "mysql", "mssql", "databricks")


class TrackingUnavailable(RuntimeError):
    """The tracking server could not take the run now; the record stays in the spool."""


class TrackingRejected(TrackingUnavailable):
    """The tracking target refuses the run for a reason retrying cannot fix (HTTP 4xx, a bad
    URI or experiment); the message says what to fix."""


def tracking_uri(configured: Optional[str], launch_dir: str) -> str:
    """``tracking.uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<launch dir>/mlflow.db``."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI")
    if uri and uri.startswith(("http://", "https://")):
        # a server's credentials in a preset or a sub-command's --uri move where MLflow reads
        # them, as the command line's do (environment.secure_process): no URI fxtrack holds
        # carries them. A database URI keeps its own, which its driver needs (issue 60).
        uri = move_uri_credentials(uri)
    return uri or f"sqlite:///{Path(launch_dir).resolve() / 'mlflow.db'}"


def check_static(uri: str, experiment: str) -> None:
    """The URI's scheme and host, the experiment's name, and under ``mlflow run`` the same
    server as the run it created. Raises TrackingRejected."""
    where = redact_uri_text(uri)
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
    if run_env and env_uri and redact_uri_text(env_uri) != where:
        raise TrackingRejected(f"under `mlflow run` fxtrack logs into the run mlflow created at "
                               f"{redact_uri_text(env_uri)}; tracking.uri={where} names another "
                               "server: drop tracking.uri or pass it to `mlflow run` instead")


def sqlite_path(uri: str) -> Optional[Path]:
    """The database file of an embedded ``sqlite:///`` store; None for any other URI."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def deleted_experiment(uri: str, experiment: str) -> Optional[str]:
    """For an existing sqlite store: the id of ``experiment`` if it is deleted, "" if it is not
    (or does not exist yet); None when the database cannot answer this way (no MLflow schema
    yet, locked, unreadable): the caller asks MLflow instead. Read-only: never creates or
    migrates the store."""
    db = sqlite_path(uri)
    if db is None or not db.is_file():
        return None
    try:
        con = sqlite3.connect(f"file:{quote(str(db))}?mode=ro", uri=True, timeout=1.0)
        try:
            row = con.execute("SELECT experiment_id, lifecycle_stage FROM experiments "
                              "WHERE name = ?", (experiment,)).fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return str(row[0]) if row is not None and row[1] == "deleted" else ""


def check_sqlite(uri: str, experiment: str) -> bool:
    """For an embedded sqlite store: raise TrackingRejected if ``experiment`` is deleted; True
    when that was answered without MLflow (a store not created yet has nothing to check, and
    checking must not create it), False when MLflow must be asked (another kind of URI, or a
    database that cannot answer directly)."""
    db = sqlite_path(uri)
    if db is None:
        return False
    if not db.is_file():
        return True
    deleted = deleted_experiment(uri, experiment)
    if deleted:
        raise TrackingRejected(deleted_message(experiment, redact_uri_text(uri), deleted))
    return deleted is not None


def deleted_message(experiment: str, where: str, experiment_id: str) -> str:
    return (f"experiment {experiment!r} at {where} is deleted: restore it "
            f"(mlflow experiments restore --experiment-id {experiment_id}) "
            "or choose another tracking.experiment")
