"""``fxtrack sync``: upload every spooled result that a tracking server missed."""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str]) -> int:
    """Upload every spooled result that a tracking server missed, exactly once (several syncs
    may run at once: each entry is claimed by one of them)."""
    parser = argparse.ArgumentParser(prog="fxtrack sync", description=main.__doc__)
    parser.add_argument("--uri", help="upload here instead of each result's own tracking URI")
    args = parser.parse_args(argv)
    from fxtrack.tracking import spool, writer

    entries = list(spool.pending())
    bad = spool.quarantined()
    for entry in bad:
        reason = (entry / "reason.txt").read_text().strip() if (entry / "reason.txt").is_file() else "?"
        print(f"set aside {entry} ({reason})", file=sys.stderr)
    if not entries:
        print(f"fxtrack sync: nothing to upload ({spool.spool_dir()} has no waiting results)")
        return 1 if bad else 0
    uploaded = kept = rejected = busy = 0
    for entry in entries:
        try:
            record = spool.load(entry)
        except (OSError, ValueError):
            continue  # claimed and delivered by another sync meanwhile
        try:
            run_id = writer.deliver(entry, args.uri or _with_credentials(record["uri"]))
            uploaded += 1
            print(f"uploaded {record['run_name']} -> run {run_id}")
        except writer.EntryBusy:
            busy += 1  # another sync claimed it: that one reports it
        except writer.TrackingRejected as e:
            rejected += 1
            print(f"kept {record['run_name']} ({entry.name}): refused, fix this first: {e}",
                  file=sys.stderr)
        except writer.TrackingUnavailable as e:
            kept += 1
            print(f"kept {record['run_name']} ({entry.name}): {e}", file=sys.stderr)
    print(f"fxtrack sync: {uploaded} uploaded, {kept + rejected} still spooled"
          + (f" ({rejected} refused by the server)" if rejected else "")
          + (f", {busy} left to another sync" if busy else "")
          + (f", {len(bad)} unreadable set aside in {spool.spool_dir() / spool.BAD}" if bad else ""))
    return 1 if kept or rejected or bad else 0


def _with_credentials(uri: str) -> str | None:
    """Spooled URIs carry no credentials; $MLFLOW_TRACKING_URI may, for the same server."""
    from fxtrack.environment import redact_uri

    env = os.environ.get("MLFLOW_TRACKING_URI")
    return env if env and redact_uri(env) == uri else None
