"""Per-job fixed cost (issue 26 item 4): the cuts keep their behaviour. MLflow is loaded while
the worker starts, behind a gate the worker waits at; an embedded store's experiment is checked
without MLflow; the bench scripts parse their options."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import fxtrack_env, job_spec

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


@pytest.mark.parametrize("script,option", [("bench/job_overhead.py", "--rounds"),
                                           ("bench/reference.py", "--rounds"),
                                           ("bench/overhead.py", "--model"),
                                           ("bench/profile_step.py", "vit-torch"),
                                           ("bench/bf16_dots.py", "--frameworks")])
def test_bench_scripts_parse_their_options(script, option):
    out = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert option in out.stdout


def test_bf16_dots_bench_times_every_form_in_each_framework():
    pytest.importorskip("jax")
    pytest.importorskip("tensorflow")
    out = subprocess.run([sys.executable, "bench/bf16_dots.py", "--rounds", "1", "--m", "8",
                          "--k", "16", "--n", "24"], cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # fixed-width columns: framework (11), form (26), median ms, ratio, what
    rows = {(line[:11].strip(), line[12:38].strip()): tuple(map(float, line[38:].split()[:2]))
            for line in out.stdout.splitlines()[2:]}
    forms = ("bf16 result", "f32 result", "dx, f32 result", "dw, lhs contracts axis 0",
             "dw, x^T written out")
    assert set(rows) == {(f, form) for f in ("jax", "tensorflow") for form in forms}
    assert all(ms > 0 for ms, _ in rows.values())
    assert rows["jax", "bf16 result"][1] == rows["tensorflow", "bf16 result"][1] == 1.0


# A stand-in for the worker: it waits at the real gate (fxtrack.worker.protocol.pass_gate),
# then says whether it was told to go and whether the orchestrator's work had finished by then.
FAKE_WORKER = """#!{python}
import os, sys
sys.path.insert(0, {root!r})
from fxtrack.worker import protocol
had_gate = protocol.GATE_ENV in os.environ
protocol.take_gate()
try:
    protocol.pass_gate()
    go = True
except protocol.GateClosed:
    go = False
print("gate" if had_gate else "no gate", "go" if go else "stop",
      "after" if os.path.exists({marker!r}) else "before", flush=True)
"""


def fake_worker(tmp_path: Path) -> tuple[str, Path]:
    marker = tmp_path / "meanwhile-done"
    path = tmp_path / "python"
    path.write_text(FAKE_WORKER.format(python=sys.executable, root=str(ROOT), marker=str(marker)))
    path.chmod(0o755)
    return str(path), marker


def test_the_worker_waits_at_the_gate_until_the_orchestrators_work_is_done(tmp_path):
    from fxtrack.orchestrator.runner import run_worker

    python, marker = fake_worker(tmp_path)

    def meanwhile():
        import time

        time.sleep(1.0)  # the worker has long reached its gate by now
        marker.write_text("done")

    run_worker(job_spec("torch", "vit", tmp_path), tmp_path, python, 60, echo=False,
               meanwhile=meanwhile)
    assert (tmp_path / "worker.log").read_text().split() == ["gate", "go", "after"]


def test_a_failure_in_the_orchestrators_work_stops_the_worker_unrun(tmp_path):
    from fxtrack.orchestrator.runner import run_worker

    python, _ = fake_worker(tmp_path)

    def meanwhile():
        raise SystemExit(2)

    with pytest.raises(SystemExit):
        run_worker(job_spec("torch", "vit", tmp_path), tmp_path, python, 60, echo=False,
                   meanwhile=meanwhile)
    assert (tmp_path / "worker.log").read_text().split() == ["gate", "stop", "before"]


def test_without_work_to_overlap_the_worker_has_no_gate(tmp_path):
    from fxtrack.orchestrator.runner import run_worker

    python, _ = fake_worker(tmp_path)
    run_worker(job_spec("torch", "vit", tmp_path), tmp_path, python, 60, echo=False)
    assert (tmp_path / "worker.log").read_text().split() == ["no", "gate", "go", "before"]


def test_a_worker_that_cannot_start_is_a_failed_result_with_the_gate_set(tmp_path):
    from fxtrack.orchestrator.runner import run_worker

    result = run_worker(job_spec("torch", "vit", tmp_path), tmp_path, str(tmp_path / "nothing"),
                        60, echo=False, meanwhile=lambda: None)
    assert result.status == "FAILED" and "cannot start the worker" in result.error


def test_a_stopped_gate_leaves_the_worker_unrun(tmp_path, monkeypatch):
    """The worker's side: a gate closed without a word means no run, and an error saying so."""
    from fxtrack.worker import __main__ as worker
    from fxtrack.worker import protocol

    read, write = os.pipe()
    os.close(write)
    monkeypatch.setenv(protocol.GATE_ENV, str(read))
    monkeypatch.setattr(worker, "prepare_environment", lambda spec: None)
    result = worker.run(job_spec("torch", "vit", tmp_path))
    assert result.status != "FINISHED" and "stopped before the run" in result.error
    assert protocol.GATE_ENV not in os.environ  # not handed on to the worker's own children


def test_the_gate_opens_after_the_build_before_anything_is_timed(tmp_path, monkeypatch):
    """The worker builds the model, then waits: the build overlaps the orchestrator's MLflow
    load, the warm-up and the timed window do not. The scenario's own build passes the gate
    (scenarios.timed.build), once."""
    from fxtrack.scenarios import timed
    from fxtrack.worker import protocol
    from fxtrack.worker.protocol import Result

    for said, outcome in ((b"1", "went on"), (b"", "stopped")):
        read, write = os.pipe()
        os.write(write, said)
        os.close(write)
        monkeypatch.setenv(protocol.GATE_ENV, str(read))
        protocol.take_gate()
        events = []
        backend = SimpleNamespace(
            spec=job_spec("torch", "vit", tmp_path, batch_size=4), device_kind=lambda: "cpu",
            device_tags=lambda: {"device": "test-cpu"}, build=lambda batch: events.append(("built", batch, protocol.GATE_ENV in os.environ)))
        try:
            timed.build(backend, Result(result_id="r"))
            events.append("went on")
        except protocol.GateClosed:
            events.append("stopped")
        # built while the gate was still shut, its number no longer in the environment
        assert events == [("built", 4, False), outcome]
        timed.build(backend, Result(result_id="r"))  # a second build does not wait again
        assert events[-1] == ("built", 4, False)


def test_a_sqlite_store_is_checked_without_importing_mlflow(tmp_path):
    """preflight on an existing embedded store: a deleted experiment still stops the run (exit 2,
    its restore command), a live one passes, and neither imports MLflow."""
    from fxtrack.tracking import runs

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = runs.client_for(uri)
    gone = client.create_experiment("gone")
    client.delete_experiment(gone)
    client.create_experiment("live")
    code = f"""
import sys
from types import SimpleNamespace
from fxtrack.orchestrator.app import preflight
conf = lambda name: SimpleNamespace(tracking=SimpleNamespace(uri={uri!r}, experiment=name))
preflight(conf("live"), ".")
preflight(conf("new"), ".")
print("mlflow" in sys.modules, flush=True)
preflight(conf("gone"), ".")
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120,
                         env=fxtrack_env(tmp_path, {"PYTHONPATH": str(ROOT)}))
    assert out.returncode == 2, out.stderr
    assert out.stdout.split() == ["False"]
    assert f"experiment 'gone' at {uri} is deleted" in out.stderr
    assert f"--experiment-id {gone}" in out.stderr


def test_a_store_sqlite_cannot_answer_is_left_to_mlflow(tmp_path, monkeypatch, isolated_store):
    """A database without MLflow's tables: the direct read gives no answer (None) and preflight
    falls back to MLflow's own check, as before the cut."""
    import sqlite3

    from fxtrack.orchestrator import app
    from fxtrack.tracking import target, writer

    db = tmp_path / "other.db"
    sqlite3.connect(db).close()
    uri = f"sqlite:///{db}"
    assert target.deleted_experiment(uri, "fxtrack") is None
    asked = []
    monkeypatch.setattr(writer, "check_target", lambda u, e: asked.append((u, e)))
    app.preflight(SimpleNamespace(tracking=SimpleNamespace(uri=uri, experiment="fxtrack")), ".")
    assert asked == [(uri, "fxtrack")]


def test_the_job_loads_tracking_once_and_never_fails_the_run_for_it(monkeypatch):
    from fxtrack.tracking import runs, tracker

    calls = []

    def client_for(uri):
        calls.append(uri)
        raise RuntimeError("store unreadable")  # the log after the run reports it

    monkeypatch.setattr(runs, "client_for", client_for)
    monkeypatch.setattr(tracker, "_LOADED", set())
    fake = tracker.Tracker("sqlite:////nowhere/mlflow.db", "fxtrack")
    fake.load()
    fake.load()
    assert calls == ["sqlite:////nowhere/mlflow.db"]


def test_job_overhead_bare_arm_trains_from_the_spec(tmp_path):
    """The bench's bare arm runs the spec's training through the backend (tiny, 1+1 steps)."""
    spec = job_spec("torch", "vit", tmp_path, steps=1, warmup_steps=1)
    path = tmp_path / "spec.json"
    spec.dump(path)
    out = subprocess.run([sys.executable, "bench/job_overhead.py", "--bare", str(path)], cwd=ROOT,
                         env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("bare: 1+1 steps of batch 2, last loss ")
    assert json.loads(path.read_text())["result_id"] == spec.result_id


EXIT_NOW = """
import atexit, sys, tempfile, threading, time
from pathlib import Path
from fxtrack import cli
out = Path(sys.argv[1])
keep = tempfile.TemporaryDirectory(dir=out)  # a weakref finalizer: removed at exit
(out / "tmpdir").write_text(keep.name)
atexit.register(lambda: (out / "atexit").write_text("ran"))
def late():
    time.sleep(0.5)
    (out / "thread").write_text("joined")
threading.Thread(target=late).start()
print("buffered", end="")
sys.argv[1:] = []
cli.command = lambda: sys.exit(EXIT)
cli._RAN_APP.append(True)
cli.main()
"""


@pytest.mark.parametrize("code, status", [("3", 3), ("None", 0), ("'fxtrack: a message'", 1)])
def test_exit_now_keeps_what_the_interpreters_teardown_would_do(tmp_path, code, status):
    """The run's end skips Python's module teardown (~0.5 s with MLflow loaded), not what the
    teardown is for: exit status, threads joined, atexit handlers, finalizers, flushed output."""
    out = subprocess.run([sys.executable, "-c", EXIT_NOW.replace("EXIT", code), str(tmp_path)],
                         env=ENV, capture_output=True, text=True, timeout=60)
    assert out.returncode == status, out.stderr
    assert out.stdout == "buffered"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "joined"
    assert not Path((tmp_path / "tmpdir").read_text()).exists()
    assert out.stderr == ("fxtrack: a message\n" if status == 1 else "")


def _job_overhead():
    spec = importlib.util.spec_from_file_location("job_overhead", ROOT / "bench" / "job_overhead.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_itemised_phases_add_up_to_each_arms_wall_time(tmp_path):
    """--itemise (issue 46, item 3): every mark of both arms is there, so fxtrack's own hooks
    (runner.run_worker, the gate, Job.run, the step timer) are still where the marks look, and
    each arm's phases run end to end: they add up to its wall time, none negative."""
    bench = _job_overhead()
    arms = bench.arms_of("torch", tmp_path, itemise=True)
    for arm in ("fxtrack", "bare"):
        cmd, env = arms[arm]
        got = bench.timed_run(cmd + ["steps=2", "warmup_steps=1"] if arm == "fxtrack" else cmd,
                              tmp_path, env)
        names = [name for name, _, _ in bench.PHASES[arm]]
        assert all(got[name] >= 0 for name in names), (arm, got)
        assert sum(got[name] for name in names) == pytest.approx(got["wall"], abs=1e-6), got
        assert got["warm-up and timed steps"] > 0, got
        if arm == "fxtrack":  # MLflow loaded while the worker built, and only then the gate
            assert got[bench.ALONGSIDE[0]] > 0, got


def test_itemised_marks_refuse_a_run_with_a_mark_missing():
    bench = _job_overhead()
    with pytest.raises(SystemExit, match="no 'worker built' mark"):
        bench.phases("orchestrator interpreter 1.0\norchestrator job_run 1.1\n"
                     "orchestrator worker_spawn 1.2\nworker interpreter 1.3\n", 0.0, 2.0)
