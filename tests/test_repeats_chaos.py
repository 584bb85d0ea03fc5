"""Issue 60's chaos test of ``repeats`` sweeps: clean, and SIGINT / SIGTERM / SIGKILL to the
orchestrator and to a worker, each followed by ``fxtrack sync``, a second sync and the same sweep
with ``resume=true``. After each step: every finished repeat exists once, every aggregate is
FINISHED with its figures or KILLED/FAILED with its finished repeats' figures, nothing RUNNING,
no process left, and ``fxtrack report`` shows the kept figures."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import report_here, run_fxtrack, seed_peak_cache

import test_nothing_lost
from test_nothing_lost import (
    TINY,
    processes_mentioning,
    store_runs,
    sync,
    user_env,
    wait_for,
    worker_pids,
)

reaper = test_nothing_lost.reaper  # the fixture: whatever a test started is gone after it
# each case is a real sweep, a resumed one, three syncs, two reports (in this process: its
# store and spool are the test's own)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("isolated_store")]

SWEEP = ["-m", *TINY, "steps=2", "repeats=2"]  # fxtrack's arguments


def job_worker(tmp_path: Path, job: int) -> list[int]:
    """The worker of sweep job ``job`` (multirun/<date>/<time>/<job>/spec.json)."""
    return [pid for pid in worker_pids(tmp_path)
            if f"/{job}/spec.json" in Path(f"/proc/{pid}/cmdline").read_bytes().decode()]


def start(tmp_path: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fxtrack", *SWEEP, *overrides], cwd=tmp_path,
                            env=user_env(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "first.log", "w"))


def state(tmp_path: Path) -> tuple[list, list]:
    """(aggregates, repeats) in the store."""
    runs = store_runs(tmp_path)
    return ([r for r in runs if r.data.tags.get("fxtrack.kind") == "aggregate"],
            [r for r in runs if r.data.tags.get("fxtrack.repeat_of")])


def check(tmp_path: Path, groups: int, resumed: bool) -> dict[str, int]:
    """The store's invariants after a step; {aggregate run id: repeats its figures stand on}."""
    runs = store_runs(tmp_path)
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    aggregates, repeats = state(tmp_path)
    assert len(aggregates) == groups, [a.info.run_name for a in aggregates]  # one per group
    finished = Counter((r.data.tags["fxtrack.repeat_of"], r.data.tags["fxtrack.repeat"])
                       for r in repeats
                       if r.info.status == "FINISHED")
    assert finished and max(finished.values()) == 1, finished  # no finished repeat twice
    kept = {}
    for agg in aggregates:
        mine = [r for r in repeats if r.data.tags["fxtrack.repeat_of"]
                == agg.data.tags["fxtrack.result_id"] and r.info.status == "FINISHED"]
        assert mine, agg.info.run_name  # each case leaves at least one repeat finished
        # the aggregate's name is never a separate run's: it says it pools its repeats
        assert agg.info.run_name.endswith("-repeats2"), agg.info.run_name
        assert {r.info.run_name.rsplit("-r", 1)[0] for r in mine} == {
            agg.info.run_name[:-len("-repeats2")]}, agg.info.run_name
        figures = agg.data.metrics
        assert agg.info.status in ("FINISHED", "KILLED", "FAILED"), agg.info.status
        assert figures["repeats"] == len(mine), (agg.info.run_name, figures)  # the kept ones
        assert figures["throughput_samples_per_s"] > 0
        if resumed:  # the group completed: every repeat finished, the aggregate closed
            assert agg.info.status == "FINISHED" and len(mine) == 2, agg.info.run_name
        kept[agg.info.run_id] = len(mine)
    assert processes_mentioning(str(tmp_path)) == []
    return kept


def report_shows(tmp_path: Path, kept: dict[str, int]) -> None:
    """``fxtrack report`` ranks every aggregate with the repeats it stands on."""
    out = report_here(tmp_path)
    assert out.returncode == 0, out.stderr
    with open(tmp_path / "fxtrack-report" / "report.csv") as f:
        rows = {row["run_id"]: row for row in csv.DictReader(f)}
    assert set(rows) == set(kept), (set(rows), kept)
    assert all(int(float(rows[r]["repeats"])) == n for r, n in kept.items())


def sync_twice_then_resume(tmp_path: Path, sweep: list[str], groups: int, skipped: int) -> None:
    first = sync(tmp_path)
    assert first.returncode == 0, first.stderr
    second = sync(tmp_path)  # nothing left, and nothing it closes again
    assert second.returncode == 0 and "nothing to upload" in second.stdout, second
    report_shows(tmp_path, check(tmp_path, groups, resumed=False))
    again = run_fxtrack(tmp_path, *SWEEP, *sweep, "resume=true",
                        env=seed_peak_cache(tmp_path / "cache"), timeout=900)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("skipped (resume=true)") == skipped, again.stderr
    assert sync(tmp_path).stdout.startswith("fxtrack sync: nothing to upload")
    report_shows(tmp_path, check(tmp_path, groups, resumed=True))



def test_worker_signals_and_a_clean_config_in_one_repeats_sweep(tmp_path, reaper):
    """Four configs (depths: four identities the report ranks apart), two repeats each,
    round-robin: jobs 4, 5, 6 are the second repeats of depths 1, 2, 3, whose workers get SIGINT,
    SIGTERM, SIGKILL; depth 4 runs undisturbed (the clean case: a finished sweep that the next
    sync used to close FAILED)."""
    proc = start(tmp_path, "model.layers=1,2,3,4")
    reaper.append(proc)
    for job, sig in ((4, signal.SIGINT), (5, signal.SIGTERM), (6, signal.SIGKILL)):
        os.kill(wait_for(lambda: job_worker(tmp_path, job), 600, f"job {job}'s worker")[0], sig)
    assert proc.wait(timeout=900) == 1, (tmp_path / "first.log").read_text()  # 3 cells failed
    aggregates, _ = state(tmp_path)
    assert sorted(a.info.status for a in aggregates) == ["FINISHED"] * 4
    sync_twice_then_resume(tmp_path, ["model.layers=1,2,3,4"], groups=4, skipped=5)  # 3 second repeats run again


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["sigint", "sigterm", "sigkill"])
def test_a_signal_to_the_orchestrator_keeps_the_finished_repeats(tmp_path, reaper, sig):
    """One config, two repeats; the orchestrator is signalled while the second repeat's worker
    runs. The aggregate closes KILLED (SIGINT, SIGTERM: by the orchestrator) or FAILED (SIGKILL:
    by sync, from its held fallback) with the first repeat's figures; resume=true runs only the
    second repeat and completes the same aggregate."""
    proc = start(tmp_path, "seed=0")
    reaper.append(proc)
    wait_for(lambda: job_worker(tmp_path, 1), 600, "the second repeat's worker")
    proc.send_signal(sig)
    code = proc.wait(timeout=120)
    assert code == (-9 if sig == signal.SIGKILL else 128 + sig), code
    wait_for(lambda: not worker_pids(tmp_path), 30, "the worker to stop with its orchestrator")
    log = (tmp_path / "first.log").read_text()
    if sig != signal.SIGKILL:
        assert "1 repeats aggregate(s) KILLED with their finished repeats" in log, log
        [aggregate], _ = state(tmp_path)
        assert aggregate.info.status == "KILLED" and aggregate.data.metrics["repeats"] == 1
    sync_twice_then_resume(tmp_path, ["seed=0"], groups=1, skipped=1)


def test_a_single_repeats_run_resumes_its_group(tmp_path, reaper):
    """``repeats=2`` without a sweep: the second repeat's worker is SIGKILLed (the run exits 1,
    its aggregate FINISHED on the first repeat); resume=true runs the second repeat only and
    completes the same aggregate."""
    single = [*TINY, "steps=2", "repeats=2"]
    proc = subprocess.Popen([sys.executable, "-m", "fxtrack", *single], cwd=tmp_path,
                            env=user_env(tmp_path),
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "first.log", "w"))
    reaper.append(proc)
    second = lambda: [pid for pid in worker_pids(tmp_path)  # noqa: E731
                      if "/repeat1/spec.json" in Path(f"/proc/{pid}/cmdline").read_text()]
    os.kill(wait_for(second, 600, "the second repeat's worker")[0], signal.SIGKILL)
    assert proc.wait(timeout=300) == 1, (tmp_path / "first.log").read_text()
    assert check(tmp_path, groups=1, resumed=False)
    again = run_fxtrack(tmp_path, *single, "resume=true", env=seed_peak_cache(tmp_path / "cache"),
                        timeout=600)
    assert again.returncode == 0, again.stderr
    assert "-r0: finished before; kept (resume=true)" in again.stderr, again.stderr
    assert again.stderr.count("building vit") == 1, again.stderr  # one worker: the second repeat
    report_shows(tmp_path, check(tmp_path, groups=1, resumed=True))
