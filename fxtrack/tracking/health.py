"""Whether the tracking server answers, and how long to wait before asking again: one
``/health`` request with a short timeout, remembered per URI, so that a server that is down
costs seconds per sync instead of MLflow's minutes of retries per request."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request

from fxtrack.environment import redact_uri_text
from fxtrack.tracking.errors import ServerUnreachable

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
_ANSWERED: set[str] = set()  # URIs that answered at least once in this process

# MLflow's own settings for every request it makes, unless the user set them. They are read at
# each request, so setting them before the first client (not at import) is enough.
MLFLOW_DEFAULTS = {
    # An unreachable server should cost seconds, not the minutes of MLflow's default back-off.
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
    # MLflow's "View run at" lines cost a get_run per closed run, on every result; fxtrack prints
    # the run id itself.
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}


def mlflow_defaults() -> None:
    """MLFLOW_DEFAULTS into the environment where unset; called before fxtrack's first MLflow
    request (the writer's client, the reader), and inherited by the processes it starts."""
    for key, value in MLFLOW_DEFAULTS.items():
        os.environ.setdefault(key, value)


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
        mark_down(uri, f"no answer from {redact_uri_text(uri).rstrip('/')}/health within {PROBE_TIMEOUT_S:g} s "
                       f"({type(e).__name__})")
        raise ServerUnreachable(_DOWN[uri][0]) from None
    _DOWN.pop(uri, None)
    _UP[uri] = time.monotonic()
    _ANSWERED.add(uri)


def mark_down(uri: str, why: str) -> None:
    _DOWN[uri] = (why, time.monotonic())
    _UP.pop(uri, None)


def answered(uri: str) -> None:
    """``uri`` just took every request of a run: as good as a /health probe, where one was made."""
    if uri in _UP:
        _UP[uri] = time.monotonic()


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
