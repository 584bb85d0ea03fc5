"""Sub-commands of the ``fxtrack`` console script other than the Hydra app."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional


def doctor(argv: list[str]) -> int:
    from fxtrack.doctor import main

    return main(argv)


def report(argv: list[str]) -> int:
    from fxtrack.report.cli import main

    return main(argv)


def sync(argv: list[str]) -> int:
    """Upload every spooled result that a tracking server missed, exactly once."""
    parser = argparse.ArgumentParser(prog="fxtrack sync", description=sync.__doc__)
    parser.add_argument("--uri", help="upload here instead of each result's own tracking URI")
    args = parser.parse_args(argv)
    from fxtrack.tracking import spool, writer

    entries = list(spool.pending())
    if not entries:
        print(f"fxtrack sync: nothing to upload ({spool.spool_dir()} is empty)")
        return 0
    failed = 0
    for entry in entries:
        record = spool.load(entry)
        try:
            run_id = writer.deliver(entry, args.uri or _with_credentials(record["uri"]))
            print(f"uploaded {record['run_name']} -> run {run_id}")
        except writer.TrackingUnavailable as e:
            failed += 1
            print(f"kept {record['run_name']} ({entry.name}): {e}", file=sys.stderr)
    print(f"fxtrack sync: {len(entries) - failed} uploaded, {failed} still spooled")
    return 1 if failed else 0


def _with_credentials(uri: str) -> Optional[str]:
    """Spooled URIs carry no credentials; $MLFLOW_TRACKING_URI may, for the same server."""
    from fxtrack.environment import redact_uri

    env = os.environ.get("MLFLOW_TRACKING_URI")
    return env if env and redact_uri(env) == uri else None
