"""Sub-commands of the ``fxtrack`` console script other than the Hydra app."""

from __future__ import annotations

import argparse
import sys


def sync(argv: list[str]) -> int:
    """Upload every spooled result that a tracking server missed, exactly once."""
    parser = argparse.ArgumentParser(prog="fxtrack sync", description=sync.__doc__)
    parser.parse_args(argv)
    from fxtrack.tracking import spool, writer

    entries = list(spool.pending())
    if not entries:
        print(f"fxtrack sync: nothing to upload ({spool.spool_dir()} is empty)")
        return 0
    failed = 0
    for entry in entries:
        record = spool.load(entry)
        try:
            run_id = writer.deliver(entry)
            print(f"uploaded {record['run_name']} -> run {run_id}")
        except writer.TrackingUnavailable as e:
            failed += 1
            print(f"kept {record['run_name']} ({entry.name}): {e}", file=sys.stderr)
    print(f"fxtrack sync: {len(entries) - failed} uploaded, {failed} still spooled")
    return 1 if failed else 0
