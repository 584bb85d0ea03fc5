"""The local spool: a run's record is written here before logging and removed only after the
tracking server acknowledged the whole run, so a failure never loses a measurement.

Layout under ``spool_dir()``: ``<result_id>/`` (``record.json`` + ``artifacts/``) is waiting;
``<result_id>.claim-<host>-<pid>/`` is being uploaded by that process (claimed by an atomic
``rename``, so two ``fxtrack sync`` processes never upload the same entry); ``bad/<name>/``
holds entries that cannot be read, with ``reason.txt``, set aside so the rest still upload.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Optional

RECORD = "record.json"
BAD = "bad"
_CLAIM = ".claim-"
# A claim whose process cannot be checked (another host) is taken back after this long (s).
CLAIM_LEASE_S = float(os.environ.get("FXTRACK_CLAIM_LEASE_S", "3600"))


class SpoolError(OSError):
    """The spool cannot be written; raised before a worker starts, so no result is lost."""


def spool_dir() -> Path:
    """``$FXTRACK_HOME/spool``, by default ``~/.cache/fxtrack/spool``."""
    home = os.environ.get("FXTRACK_HOME") or Path.home() / ".cache" / "fxtrack"
    return Path(home) / "spool"


def check_writable() -> Path:
    """Raise SpoolError unless a record can be written to the spool (checked before work)."""
    root = spool_dir()
    probe = root / f".probe-{uuid.uuid4().hex}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise SpoolError(f"the result spool {root} is not writable ({e.strerror or e}): set "
                         "FXTRACK_HOME to a writable directory") from None
    return root


def write(record: dict[str, Any], artifacts: dict[str, Path | str]) -> Path:
    """Spool one run: ``record`` (JSON-able) plus artifact files (paths copied, strings written)."""
    entry = spool_dir() / record["result_id"]
    tmp = entry.with_name(f"{entry.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "artifacts").mkdir(parents=True)
    for name, content in artifacts.items():
        target = tmp / "artifacts" / name
        if isinstance(content, Path):
            if content.exists():
                shutil.copyfile(content, target)
        else:
            target.write_text(content)
    (tmp / RECORD).write_text(json.dumps(record, indent=1))
    shutil.rmtree(entry, ignore_errors=True)
    tmp.rename(entry)  # atomic: a half-written entry is never seen as spooled
    return entry


def _is_entry(p: Path) -> bool:
    return p.is_dir() and _CLAIM not in p.name and ".tmp" not in p.name and p.name != BAD \
        and not p.name.startswith(".")


def pending() -> Iterator[Path]:
    """Unclaimed entries, parents (sweeps) before their children, oldest first. Claims of dead
    processes are taken back first; unreadable entries are moved to ``bad/`` (see
    ``quarantined``) instead of stopping the rest."""
    root = spool_dir()
    if not root.is_dir():
        return iter(())
    reclaim_stale()
    keyed = []
    for p in root.iterdir():
        if not _is_entry(p):
            continue
        try:
            record = load(p)
            keyed.append(((record.get("parent_result_id") is not None,
                           (p / RECORD).stat().st_mtime), p))
        except FileNotFoundError:
            continue  # claimed by another process meanwhile
        except (OSError, ValueError, AttributeError) as e:
            quarantine(p, f"unreadable record: {type(e).__name__}: {e}")
    return iter(p for _, p in sorted(keyed))


def quarantined() -> list[Path]:
    bad = spool_dir() / BAD
    return sorted(bad.iterdir()) if bad.is_dir() else []


def quarantine(entry: Path, reason: str) -> Optional[Path]:
    """Set an unreadable entry aside in ``bad/`` with ``reason.txt`` (kept for a human)."""
    target = spool_dir() / BAD / f"{entry.name}-{uuid.uuid4().hex[:6]}"
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        entry.rename(target)
    except OSError:
        return None  # claimed or moved meanwhile
    (target / "reason.txt").write_text(reason + "\n")
    return target


def find(result_id: str) -> Optional[Path]:
    """The entry of ``result_id`` if it is waiting or claimed (the sweep parent of a child)."""
    root = spool_dir()
    entry = root / result_id
    if entry.is_dir():
        return entry
    return next(iter(root.glob(f"{result_id}{_CLAIM}*")), None) if root.is_dir() else None


def claim(entry: Path) -> Optional[Path]:
    """Take ``entry`` for this process by an atomic rename; None if another process has it."""
    if _CLAIM in entry.name:
        return entry if entry.name.endswith(_claim_suffix()) else None
    claimed = entry.with_name(entry.name + _claim_suffix())
    try:
        entry.rename(claimed)
    except OSError:
        return None
    os.utime(claimed)  # the claim's age counts from now
    return claimed


def release(claimed: Path) -> Path:
    """Give a claimed entry back to the spool (its delivery failed; it is retried later)."""
    entry = claimed.with_name(claimed.name.split(_CLAIM)[0])
    if entry.exists():  # rewritten meanwhile (a sweep parent's closing record): that one wins
        remove(claimed)
        return entry
    try:
        claimed.rename(entry)
    except OSError:
        return claimed
    return entry


def _claim_suffix() -> str:
    return f"{_CLAIM}{socket.gethostname()}-{os.getpid()}"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reclaim_stale() -> None:
    """Claims left by a process that died (same host), or older than CLAIM_LEASE_S, go back."""
    host = socket.gethostname()
    for p in spool_dir().glob(f"*{_CLAIM}*"):
        owner = p.name.split(_CLAIM, 1)[1]
        owner_host, _, pid = owner.rpartition("-")
        try:
            age = time.time() - p.stat().st_mtime
        except OSError:
            continue
        dead = owner_host == host and pid.isdigit() and not alive(int(pid))
        if dead or age > CLAIM_LEASE_S:
            release(p)


def load(entry: Path) -> dict[str, Any]:
    record = json.loads((entry / RECORD).read_text())
    if not isinstance(record, dict) or "result_id" not in record or "uri" not in record:
        raise ValueError("not an fxtrack record")
    return record


def remove(entry: Path) -> None:
    shutil.rmtree(entry, ignore_errors=True)
