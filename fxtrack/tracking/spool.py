"""The local spool: a run's record is written here before logging and removed only after the
tracking server acknowledged the whole run, so a failure never loses a measurement.

Layout under ``spool_dir()``: ``<result_id>/`` (``record.json`` + ``artifacts/``) is waiting;
``<result_id>.claim-<host>-<pid>/`` is being uploaded by that process (claimed by an atomic
``rename``, so two ``fxtrack sync`` processes never upload the same entry); ``bad/<name>/``
holds entries that cannot be read or delivered, with ``reason.txt``, set aside so the rest
still upload.

Every filesystem error is raised as SpoolError (or reported by ``scan``), never swallowed: a
read-only or full spool must not look like an empty one.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Optional

import psutil

RECORD = "record.json"
BAD = "bad"
_CLAIM = ".claim-"
_HELD = ".held-"  # hold(): a live process's fallback record, no sync's to take
# A claim whose process cannot be checked (another host) is taken back after this long (s).
CLAIM_LEASE_S = float(os.environ.get("FXTRACK_CLAIM_LEASE_S", "3600"))


class SpoolError(OSError):
    """The spool cannot be written or read (read-only, full, no permission); the message says
    which path and why."""


def _why(e: OSError) -> str:
    return f"{type(e).__name__}: {e.strerror or e}"


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
    except OSError as e:
        raise SpoolError(f"the result spool {root} is not writable ({e.strerror or e}): set "
                         "FXTRACK_HOME to a writable directory") from None
    finally:
        try:
            probe.unlink(missing_ok=True)  # also the empty file a full disk leaves behind
        except OSError:
            pass
    return root


def write(record: dict[str, Any], artifacts: dict[str, Path | str], suffix: str = "") -> Path:
    """Spool one run: ``record`` (JSON-able) plus artifact files (paths copied, strings written).
    Raises SpoolError (and leaves no partial entry behind) when it cannot be written whole.
    ``suffix``: the entry's name after the result id (``hold``'s)."""
    entry = spool_dir() / (record["result_id"] + suffix)
    tmp = entry.with_name(f"{entry.name}.tmp-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "artifacts").mkdir(parents=True)
        for name, content in artifacts.items():
            target = tmp / "artifacts" / name
            if isinstance(content, Path):
                if content.is_dir():  # e.g. the sweep's report files
                    shutil.copytree(content, target)
                elif content.exists():
                    shutil.copyfile(content, target)
            else:
                target.write_text(content)
        (tmp / RECORD).write_text(json.dumps(record, indent=1))
        shutil.rmtree(entry, ignore_errors=True)
        tmp.rename(entry)  # atomic: a half-written entry is never seen as spooled
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk must not keep half an entry
        raise SpoolError(f"could not spool result {record['result_id']} in {entry.parent} "
                         f"({_why(e)})") from None
    return entry


def artifacts(entry: Path) -> list[tuple[str, Path]]:
    """The artifact files of an entry, by name (raises OSError when they cannot be listed)."""
    folder = entry / "artifacts"
    return [(p.name, p) for p in sorted(folder.iterdir())] if folder.is_dir() else []


def hold(record: dict[str, Any], artifacts: dict[str, Path | str]) -> Path:
    """Spool ``record`` as this process's last word, kept from every sync while this process
    lives: what the run must say if the process is killed before it logs or closes the run
    itself (SIGKILL, the OOM killer, a reboot; issue 43). ``drop`` it once the run is logged;
    if the process dies first, the next ``scan`` gives it to sync."""
    return write(record, artifacts, suffix=f"{_HELD}{socket.gethostname()}-{os.getpid()}")


def drop(held: Optional[Path]) -> None:
    """This process logged (or closed) the run itself: its held fallback is not needed."""
    if held is not None:
        remove(held)


def _is_entry(p: Path) -> bool:
    return p.is_dir() and _CLAIM not in p.name and _HELD not in p.name and ".tmp" not in p.name \
        and p.name != BAD and not p.name.startswith(".")


class Scan(NamedTuple):
    entries: list[Path]  # waiting, parents first
    problems: list[tuple[Path, str]]  # what could be neither read nor set aside, and why


def scan() -> Scan:
    """Unclaimed entries, parents (sweeps) before their children, oldest first. Claims of dead
    processes are taken back first; unreadable entries are moved to ``bad/`` (see
    ``quarantined``) instead of stopping the rest, and what cannot even be moved is reported in
    ``problems``, so that it is never mistaken for an empty spool."""
    root = spool_dir()
    if not root.is_dir():
        return Scan([], [])
    problems: list[tuple[Path, str]] = []
    try:
        reclaim_stale()
        children = list(root.iterdir())
    except OSError as e:
        return Scan([], [(root, f"cannot list the spool ({_why(e)})")])
    keyed = []
    for p in children:
        try:
            if not _is_entry(p):
                continue
            record = load(p)
            keyed.append(((record.get("parent_result_id") is not None,
                           (p / RECORD).stat().st_mtime), p))
        except FileNotFoundError:
            continue  # claimed by another process meanwhile
        except (OSError, ValueError, AttributeError) as e:
            reason = f"unreadable record: {type(e).__name__}: {e}"
            try:
                quarantine(p, reason)
            except SpoolError as err:
                problems.append((p, f"{reason}; not set aside either: {err}"))
    return Scan([p for _, p in sorted(keyed)], problems)


def pending() -> Iterator[Path]:
    """The waiting entries of ``scan()``."""
    return iter(scan().entries)


def quarantined() -> list[Path]:
    bad = spool_dir() / BAD
    try:
        return sorted(bad.iterdir()) if bad.is_dir() else []
    except OSError:
        return []  # an unlistable bad/ is reported by scan() with the spool itself


def reason_of(entry: Path) -> str:
    """Why a set-aside entry is in ``bad/``."""
    try:
        return (entry / "reason.txt").read_text().strip() or "?"
    except OSError as e:
        return f"? (reason.txt unreadable: {_why(e)})"


def quarantine(entry: Path, reason: str) -> Optional[Path]:
    """Set an entry that cannot be read or delivered aside in ``bad/`` with ``reason.txt``
    (kept for a human). The reason is written before the move, so nothing lands in ``bad/``
    without one. None if the entry was taken meanwhile; SpoolError if it cannot be set aside
    (it then stays where it was, for the caller to report)."""
    note = entry / "reason.txt"
    target = spool_dir() / BAD / f"{entry.name.split(_CLAIM)[0]}-{uuid.uuid4().hex[:6]}"
    try:
        note.write_text(reason + "\n")
        target.parent.mkdir(parents=True, exist_ok=True)
        entry.rename(target)
    except FileNotFoundError:
        return None  # claimed or moved meanwhile
    except OSError as e:
        try:
            note.unlink(missing_ok=True)  # no half-written reason left in the entry
        except OSError:
            pass
        raise SpoolError(f"could not set {entry.name} aside in {target.parent} ({_why(e)})") \
            from None
    return target


def find(result_id: str) -> Optional[Path]:
    """The entry of ``result_id`` if it is waiting or claimed (the sweep parent of a child)."""
    root = spool_dir()
    entry = root / result_id
    if entry.is_dir():
        return entry
    return next(iter(root.glob(f"{result_id}{_CLAIM}*")), None) if root.is_dir() else None


def claim(entry: Path) -> Optional[Path]:
    """Take ``entry`` for this process by an atomic rename; None if another process has it.
    SpoolError if the spool does not allow it (read-only, no permission)."""
    if _CLAIM in entry.name:
        return entry if entry.name.endswith(_claim_suffix()) else None
    claimed = entry.with_name(entry.name + _claim_suffix())
    try:
        entry.rename(claimed)
    except FileNotFoundError:
        return None  # another process renamed it first
    except OSError as e:
        raise SpoolError(f"cannot claim {entry} ({_why(e)})") from None
    try:
        os.utime(claimed)  # the claim's age counts from now
    except OSError:
        pass  # the lease then counts from the spooling: only ever earlier, never lost
    return claimed


def release(claimed: Path) -> Path:
    """Give a claimed entry back to the spool (its delivery failed; it is retried later)."""
    entry = claimed.with_name(claimed.name.split(_CLAIM)[0].split(_HELD)[0])
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
    """``pid`` runs (a zombie, killed but not yet reaped by its parent, does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # no such process (or it ended meanwhile)
        return False


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
    # a held fallback waits as long as its process lives (a run may take hours); on another
    # host, whose processes cannot be checked, for a day
    for p in spool_dir().glob(f"*{_HELD}*"):
        owner_host, _, pid = p.name.split(_HELD, 1)[1].rpartition("-")
        try:
            age = time.time() - p.stat().st_mtime
        except OSError:
            continue
        if (owner_host == host and pid.isdigit() and not alive(int(pid))) or \
                (owner_host != host and age > 24 * 3600):
            release(p)


def load(entry: Path) -> dict[str, Any]:
    record = json.loads((entry / RECORD).read_text())
    if not isinstance(record, dict) or "result_id" not in record or "uri" not in record:
        raise ValueError("not an fxtrack record")
    return record


def remove(entry: Path) -> bool:
    """Delete a delivered entry; False if it could not be (the next sync then finds its run
    already logged and clears it)."""
    shutil.rmtree(entry, ignore_errors=True)
    return not entry.exists()
