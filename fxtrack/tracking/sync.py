"""``fxtrack sync``: upload every spooled result that a tracking server missed.

Each entry ends in one of a few outcomes, and the exit status is non-zero whenever anything was
not delivered or could not even be read. An entry that cannot be logged for a reason of its own
is set aside in ``bad/`` and the sync goes on; a server that stops answering mid-sync (a
restart) is waited for, up to ``FXTRACK_SYNC_WAIT_S`` seconds, before the rest is left spooled.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

# How long a sync waits for a server that answered earlier in this sync and then stopped
# (seconds): a restart takes about a minute on a busy machine and must not end the sync.
WAIT_S = float(os.environ.get("FXTRACK_SYNC_WAIT_S", "300"))
RETRY_ROUNDS, RETRY_PAUSE_S = 10, 3.0  # for entries another process was writing (TryAgain)


def main(argv: list[str]) -> int:
    """Upload every spooled result that a tracking server missed, exactly once (several syncs
    may run at once: each entry is claimed by one of them)."""
    parser = argparse.ArgumentParser(prog="fxtrack sync", description=main.__doc__)
    parser.add_argument("--uri", help="upload here instead of each result's own tracking URI")
    args = parser.parse_args(argv)
    from fxtrack.tracking import spool

    scan = spool.scan()
    for entry in spool.quarantined():
        print(f"set aside {entry} ({spool.reason_of(entry)})", file=sys.stderr)
    for path, why in scan.problems:
        print(f"cannot read {path}: {why}", file=sys.stderr)
    if not scan.entries:
        bad = spool.quarantined()
        if scan.problems:
            print(f"fxtrack sync: nothing uploaded; {len(scan.problems)} could not be read in "
                  f"{spool.spool_dir()}")
        else:
            print(f"fxtrack sync: nothing to upload ({spool.spool_dir()} has no waiting results)")
        return 1 if bad or scan.problems else 0
    counts: Counter[str] = Counter()
    given_up: dict[str, str] = {}  # target URI -> why: its server did not come back in time
    again = []
    for entry in scan.entries:
        outcome = _sync_one(entry, args.uri, given_up)
        if outcome == "again":
            again.append(entry)
        else:
            counts[outcome] += 1
    # Entries whose run or parent another sync was writing: that takes seconds, so they are
    # retried here rather than left for the next sync.
    for _ in range(RETRY_ROUNDS):
        if not again:
            break
        time.sleep(RETRY_PAUSE_S)
        retry, again = again, []
        for entry in retry:
            outcome = _sync_one(entry, args.uri, given_up)
            if outcome == "again":
                again.append(entry)
            else:
                counts[outcome] += 1
    for entry in again:
        print(f"kept {entry.name}: another process was still writing its run", file=sys.stderr)
    counts["kept"] += len(again)
    bad = spool.quarantined()
    unreadable = len(scan.problems) + counts["stuck"]
    earlier = len(bad) - counts["set aside"]  # set aside before this sync, or by its scan
    print(f"fxtrack sync: {counts['uploaded']} uploaded, "
          f"{counts['kept'] + counts['refused'] + counts['stuck']} still spooled"
          + (f" ({counts['refused']} refused by the server)" if counts["refused"] else "")
          + (f", {counts['busy']} left to another sync" if counts["busy"] else "")
          + (f", {counts['set aside']} set aside as undeliverable" if counts["set aside"] else "")
          + (f", {unreadable} could not be read or claimed" if unreadable else "")
          + (f", {earlier} unreadable set aside in {spool.spool_dir() / spool.BAD}"
             if earlier > 0 else ""))
    failed = counts["kept"] + counts["refused"] + counts["set aside"] + unreadable + len(bad)
    return 1 if failed else 0


def _sync_one(entry: Path, uri: str | None, given_up: dict[str, str]) -> str:
    """Deliver one entry; its outcome: uploaded, busy, again, kept, refused, set aside, stuck,
    gone."""
    from fxtrack.tracking import errors, health, spool, writer
    from fxtrack.tracking.target import TrackingRejected, TrackingUnavailable

    try:
        record = spool.load(entry)
    except FileNotFoundError:
        return "gone"  # claimed and delivered by another sync meanwhile
    except (OSError, ValueError):
        record = {}  # deliver() sets it aside with the reason
    name = record.get("run_name") or entry.name
    target = uri or _with_credentials(record.get("uri", "")) or record.get("uri")
    held: Path | None = None  # our claim, kept while waiting for the server: we retry it
    try:
        for attempt in (1, 2):
            if target in given_up:
                print(f"kept {name} ({entry.name}): {given_up[target]}", file=sys.stderr)
                return "kept"
            current, held = held or entry, None
            try:
                run_id = writer.deliver(current, target, hold=attempt == 1)
            except errors.EntryBusy:
                return "busy"  # another sync claimed it: that one reports it
            except errors.TryAgain:
                return "again"
            except errors.EntryInvalid as e:
                where = f"set aside in {e.set_aside}" if e.set_aside else "kept"
                print(f"{where}: {name} ({entry.name}) cannot be logged: {e}", file=sys.stderr)
                return "set aside" if e.set_aside else "stuck"
            except errors.EntryStuck as e:
                print(f"kept {name} ({entry.name}): {e}", file=sys.stderr)
                return "stuck"
            except TrackingRejected as e:
                print(f"kept {name} ({entry.name}): refused, fix this first: {e}",
                      file=sys.stderr)
                return "refused"
            except errors.ServerUnreachable as e:
                held = getattr(e, "claimed", None)
                if attempt == 1 and target and health.was_up(target):
                    print(f"fxtrack sync: {e}; waiting up to {WAIT_S:g} s for it",
                          file=sys.stderr)
                    if health.wait_for(target, WAIT_S):
                        print("fxtrack sync: the tracking server answers again",
                              file=sys.stderr)
                        continue
                    given_up[target] = f"{e} (waited {WAIT_S:g} s)"
                elif attempt == 1:
                    given_up[target or ""] = str(e)  # down from the start: nothing to wait for
                # a second failure right after the server came back: this entry only, the
                # next entries still try
                print(f"kept {name} ({entry.name}): {e}", file=sys.stderr)
                return "kept"
            except TrackingUnavailable as e:
                print(f"kept {name} ({entry.name}): {e}", file=sys.stderr)
                return "kept"
            except Exception as e:  # noqa: BLE001 - one entry's surprise must not end the sync
                print(f"kept {name} ({entry.name}): {type(e).__name__}: {e}", file=sys.stderr)
                return "kept"
            print(f"uploaded {name} -> run {run_id}")
            return "uploaded"
        return "kept"  # not reached: the second attempt returns
    finally:
        if held is not None:
            spool.release(held)


def _with_credentials(uri: str) -> str | None:
    """Spooled URIs carry no credentials; $MLFLOW_TRACKING_URI may, for the same server."""
    from fxtrack.environment import redact_uri_text

    env = os.environ.get("MLFLOW_TRACKING_URI")
    return env if env and redact_uri_text(env) == uri else None
