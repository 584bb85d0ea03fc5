"""The tracking path at a small scale of bench/sync_load.py (issue 25, item 7): 20 spooled
results (a sweep parent and 19 children), 3 concurrent ``fxtrack sync`` processes, a
basic-auth server restarted once mid-way. Exactly once: every result lands once, none is left
RUNNING, every child keeps its parent, no sync gives up."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlflow")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import sync_load  # noqa: E402


@pytest.mark.slow
def test_twenty_results_three_syncs_one_restart_land_exactly_once():
    postgres = shutil.which("initdb") is not None and pytest.importorskip("psycopg2") is not None
    # the credential cache the team-server docs recommend: the same exactly-once path, in a
    # fraction of the server's CPU
    figures = sync_load.run(results=20, syncs=3, restarts=1, sqlite=not postgres, workers=1,
                            auth_cache_ttl_s=60)
    print("sync load figures:", figures)
    assert figures["restarts"] == 1
    assert figures["landed"] == 20 and figures["missing"] == 0 and figures["duplicates"] == 0
    assert figures["left_running"] == 0 and figures["parent_links"] == 19
    assert figures["sync_exit_codes"] == [0, 0, 0] and figures["tracebacks"] == 0
    assert figures["left_in_spool"] == 0 and figures["deleted_runs_with_artifacts_left"] == 0
