"""The delivery errors and how any exception becomes one of them.

Every delivery error ends as one of these exceptions, all TrackingUnavailable (the entry is not
in MLflow yet), classified by type and HTTP status (``MlflowException.get_http_status_code()``),
never by the text of a message:

- ``TrackingUnavailable``: the server or store is busy or failing (5xx, a locked database):
  retry later, the entry stays spooled;
- ``ServerUnreachable``: no connection at all (refused, reset, timed out): it may be restarting,
  a caller may wait for it (``health.wait_for``);
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

import socket
from pathlib import Path
from typing import Any, Optional

import mlflow

from fxtrack.environment import redact_uri_text
from fxtrack.tracking.target import TrackingRejected, TrackingUnavailable


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


def classify(e: BaseException, record: dict[str, Any]) -> TrackingUnavailable:
    """Any delivery error as ServerUnreachable (no connection), TrackingRejected (HTTP 4xx:
    say what to fix) or TrackingUnavailable (anything else: retry later)."""
    if isinstance(e, TrackingUnavailable):
        return e
    if unreachable(e):  # before the status: MLflow reports a refused connection as a 500
        return ServerUnreachable(f"cannot reach the tracking server at {record.get('uri')} "
                                 f"({_root_cause(e)}); it may be down or restarting")
    damaged = corrupt_store(e, record.get("uri"))
    if damaged:
        return TrackingRejected(damaged)
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
                                    f"{first_line(e)}")
        return TrackingUnavailable(f"HTTP {status}: {first_line(e)}")
    # e.g. sqlalchemy's OperationalError ("database is locked"): keep the entry, retry later.
    return TrackingUnavailable(f"{type(e).__name__}: {first_line(e)}")


def _chain(e: Optional[BaseException]):
    seen: list[BaseException] = []
    while e is not None and not any(e is s for s in seen):
        seen.append(e)
        yield e
        e = e.__cause__ or e.__context__


def unreachable(e: BaseException) -> bool:
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


def corrupt_store(e: BaseException, uri: Optional[str]) -> Optional[str]:
    """What to say when ``e`` comes from an embedded store whose file is no (longer a) sqlite
    database: it is not a server that is not answering, and retrying cannot help. None for
    anything else (a locked database, sqlite's OperationalError, is busy, not damaged)."""
    import sqlite3

    for link in _chain(e):
        if isinstance(link, sqlite3.DatabaseError) and not isinstance(link, sqlite3.OperationalError):
            return (f"the store {redact_uri_text(uri or '?')} is damaged ({first_line(link)}): "
                    "move the file aside (or restore it from a backup) and run again")
    return None


def _root_cause(e: BaseException) -> str:
    last = list(_chain(e))[-1]
    text = getattr(last, "strerror", None) or first_line(last)
    return f"{type(last).__name__}: {text}"


def first_line(e: BaseException) -> str:
    text = (getattr(e, "message", None) or str(e)).strip()
    return redact_uri_text(text.splitlines()[0][:300]) if text else type(e).__name__

