"""Issue 43: bad input and faults, as a skeptical operator tries them; each ends in one clear
line, with nothing lost. Real subprocesses and real signals where the fault is a process's."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import fxtrack_env, run_fxtrack, seed_peak_cache

from fxtrack.tracking.tracker import Tracker
from fxtrack.worker.protocol import Result


@pytest.mark.parametrize("override, key", [
    ("scenario=serve scenario.rate=nan", "scenario.rate"),
    ("scenario=serve scenario.rate=inf", "scenario.rate"),
    ("scenario=serve scenario.duration_s=nan", "scenario.duration_s"),
    ("scenario=fit scenario.memory_gib=nan", "scenario.memory_gib"),
    ("scenario=fit scenario.memory_gib=inf", "scenario.memory_gib"),
    ("timeout_s=nan", "timeout_s"),
    ("scenario=serve scenario.slo.e2e_ms=inf", "scenario.slo.e2e_ms"),
])
def test_nan_and_inf_are_refused_before_any_work(tmp_path, override, key):
    """Case 3: NaN and inf passed ``value <= 0`` (a NaN timeout_s turned the watchdog off)."""
    proc = run_fxtrack(tmp_path, "size=tiny", *override.split(), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"fxtrack: invalid config: {key} must be a finite number, got "
                           f"{override.rpartition('=')[2]}\n"), proc.stderr
    assert not (tmp_path / "mlflow.db").exists()  # nothing ran


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (a test's unique tmp path)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = next(line for line in (entry / "status").read_text().splitlines()
                         if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if text in cmdline and "zombie" not in state:
            found.append(int(entry.name))
    return found


def test_ui_under_sigterm_stops_its_mlflow_server(tmp_path):
    """Case 6: SIGTERM ended ``fxtrack ui`` at once (sub-commands ran before the handler was
    installed) and left mlflow ui's processes listening."""
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.MlflowClient(uri).create_experiment("fxtrack")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fxtrack", "ui", "--uri", uri, "--port",
                             str(port)], cwd=tmp_path, env=fxtrack_env(tmp_path),
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        link = proc.stdout.readline()  # printed once the UI answers
        assert link.startswith(f"http://127.0.0.1:{port}/"), proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
        deadline = time.monotonic() + 30
        while processes_mentioning(str(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_mentioning(str(tmp_path)) == []
        with socket.socket() as s, pytest.raises(OSError):
            s.connect(("127.0.0.1", port))
    finally:
        for pid in [proc.pid, *processes_mentioning(str(tmp_path))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)


TINY = ["framework=torch", "model=vit", "size=tiny", "batch_size=2", "warmup_steps=1"]


def user_env(tmp_path: Path) -> dict[str, str]:
    """conftest.fxtrack_env in tmp_path, with a peak cache of its own there: for the processes a
    test starts itself."""
    return fxtrack_env(tmp_path, seed_peak_cache(tmp_path / "cache"))


def start_sweep(tmp_path: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fxtrack", "-m", *TINY, *overrides],
                            cwd=tmp_path, env=user_env(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "orchestrator.log", "w"))


def wait_for(what, timeout_s: float, why: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {why}")


def kill_then_sync(proc: subprocess.Popen, tmp_path: Path) -> list:
    """SIGKILL the orchestrator, see its worker stop with it, run ``fxtrack sync``; the store's
    runs after it."""
    proc.kill()
    proc.wait(timeout=30)
    wait_for(lambda: not worker_pids(tmp_path), 10, "the worker to stop with its orchestrator")
    out = sync(tmp_path)
    assert out.returncode == 0, out.stderr
    return store_runs(tmp_path)


def worker_pids(tmp_path: Path) -> list[int]:
    return [pid for pid in processes_mentioning(str(tmp_path)) if b"fxtrack.worker" in
            Path(f"/proc/{pid}/cmdline").read_bytes()]


def past_the_gate(pid: int) -> bool:
    """The worker built its model and passed the orchestrator's gate (it closed the pipe)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    fd = next(v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"FXTRACK_GATE_FD="))
    return not Path(f"/proc/{pid}/fd/{fd}").exists()


def sync(tmp_path: Path) -> subprocess.CompletedProcess:
    return run_fxtrack(tmp_path, "sync", env=seed_peak_cache(tmp_path / "cache"), timeout=300)


def store_runs(tmp_path: Path):
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("fxtrack")
    return client.search_runs([exp.experiment_id]) if exp else []


@pytest.fixture
def reaper(tmp_path):
    """Whatever a test started under tmp_path is gone after it, whatever happened."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=30)
    for pid in processes_mentioning(str(tmp_path)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_result_finished_under_a_sigkilled_orchestrator_reaches_the_store_once(tmp_path,
                                                                                  reaper):
    """Case 1: the orchestrator killed outright between its worker's end and the log. Its
    finished result.json was never logged and the sweep's parent stayed RUNNING for ever; now
    ``fxtrack sync`` logs the result (once, by its result id) and closes the parent FAILED."""
    proc = start_sweep(tmp_path, "steps=2", "seed=0,1")
    reaper.append(proc)
    worker = wait_for(lambda: worker_pids(tmp_path), 300, "the first worker")[0]
    wait_for(lambda: past_the_gate(worker), 300, "the worker to pass its gate")
    proc.send_signal(signal.SIGSTOP)  # the worker runs on to its end; nothing is logged
    result = wait_for(lambda: next(tmp_path.glob("multirun/*/*/0/result.json"), None), 300,
                      "the worker's result")
    wait_for(lambda: not worker_pids(tmp_path), 120, "the worker's exit")
    proc.kill()
    proc.wait(timeout=30)
    assert worker_pids(tmp_path) == []  # the second cell never started
    import json

    result_id = json.loads(result.read_text())["result_id"]
    assert json.loads(result.read_text())["status"] == "FINISHED"
    first = sync(tmp_path)
    assert first.returncode == 0, first.stderr
    assert sync(tmp_path).returncode == 0  # nothing left: the result is not logged twice
    runs = store_runs(tmp_path)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    children = [r for r in runs if r.data.tags.get("fxtrack.result_id") == result_id]
    assert len(children) == 1 and children[0].info.status == "FINISHED"
    assert children[0].data.metrics["throughput_samples_per_s"] > 0
    parent = [r for r in runs if r.data.tags.get("fxtrack.sweep") is not None]
    assert len(parent) == 1 and parent[0].info.status == "FAILED"
    assert "orchestrator was gone" in parent[0].data.tags["fxtrack.error"]
    assert children[0].data.tags["mlflow.parentRunId"] == parent[0].info.run_id


def test_a_worker_dies_with_its_sigkilled_orchestrator(tmp_path, reaper):
    """Case 1: the worker (a session of its own) ran on to the end after its orchestrator was
    SIGKILLed; now it stops, and sync logs its run FAILED with why, the parent too."""
    proc = start_sweep(tmp_path, "steps=100000", "timeout_s=600", "seed=0,1")
    reaper.append(proc)
    worker = wait_for(lambda: worker_pids(tmp_path), 300, "the first worker")[0]
    wait_for(lambda: past_the_gate(worker), 300, "the worker to pass its gate")
    runs = kill_then_sync(proc, tmp_path)
    assert sorted(r.info.status for r in runs) == ["FAILED", "FAILED"]  # the parent, the cell
    child = next(r for r in runs if "mlflow.parentRunId" in r.data.tags)
    assert "orchestrator was gone" in child.data.tags["fxtrack.error"]


def test_a_run_whose_loss_went_nan_exits_1(tmp_path):
    """Case 8: a run whose loss went NaN (guard failed) exited 0."""
    from test_byom import BUILDERS, user_package

    env = {**seed_peak_cache(tmp_path / "cache"), **user_package(tmp_path)}
    proc = run_fxtrack(tmp_path, "framework=torch", "model=custom", BUILDERS[0], "model.lr=1e30",
                       "batch_size=2", "steps=3", "warmup_steps=1", "hardware=cpu", env=env,
                       timeout=600)
    assert proc.returncode == 1, proc.stderr
    assert "the correctness guard failed: loss is not finite" in proc.stderr
    [run] = store_runs(tmp_path)
    assert run.info.status == "FINISHED" and run.data.tags["fxtrack.guard"] == "loss is not finite"


@pytest.fixture(scope="module")
def one_run(tmp_path_factory):
    """A store with one finished tiny run."""
    cwd = tmp_path_factory.mktemp("one-run")
    proc = run_fxtrack(cwd, *TINY, "steps=2", env=seed_peak_cache(cwd / "cache"), timeout=600)
    assert proc.returncode == 0, proc.stderr
    return cwd


@pytest.mark.parametrize("out", ["a-file", "a-file/below"])
def test_a_report_out_it_cannot_write_is_one_line(one_run, tmp_path, out):
    """Case 7: an --out that is a file (FileExistsError) or below one was a traceback."""
    (tmp_path / "a-file").write_text("")
    proc = run_fxtrack(tmp_path, "report", "--uri", f"sqlite:///{one_run}/mlflow.db",
                       "--out", str(tmp_path / out), timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"fxtrack report: --out {tmp_path / out}: cannot write")
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_a_damaged_store_is_named_as_such(tmp_path):
    """Cases 7 and 8: a corrupt store was a 77-line traceback in the report and, for a run,
    'the tracking server is not answering'."""
    (tmp_path / "mlflow.db").write_bytes(b"not a database" * 1000)
    cache = seed_peak_cache(tmp_path / "cache")
    report = run_fxtrack(tmp_path, "report", env=cache, timeout=300)
    run = run_fxtrack(tmp_path, *TINY, "steps=2", env=cache, timeout=300)
    damaged = f"the store sqlite:///{tmp_path}/mlflow.db is damaged (file is not a database)"
    assert report.returncode == 1 and report.stderr.startswith(f"fxtrack report: {damaged}")
    assert report.stderr.count("\n") == 1, report.stderr
    assert run.returncode == 2 and run.stderr.startswith(f"fxtrack: {damaged}"), run.stderr
    assert not list(tmp_path.glob("outputs/*/*/worker.log"))  # refused before any work


def fit_with(tmp_path, monkeypatch, probe_run, *overrides: str, names: list | None = None):
    """fit.run_fit in this process on a tiny ViT (8 GiB budget), each probe answered by
    ``probe_run(value, calls)`` (a Result, or an exception raised); (outcome, logged records,
    probed values)."""
    from hydra import compose, initialize_config_dir

    from fxtrack.cli import CONF_DIR
    from fxtrack.config import register
    from fxtrack.config.validate import validate
    from fxtrack.scenarios.fit import driver as fit
    from fxtrack.orchestrator.job import Job, job_spec
    from fxtrack.tracking import records

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "scenario=fit", "framework=torch", "model=vit", "size=tiny", "hardware=cpu",
            "scenario.memory_gib=8", f"tracking.uri=sqlite:///{tmp_path / 'm.db'}",
            *overrides])
        conf, arch = validate(cfg)
    job = Job(cfg, conf, arch, str(tmp_path))
    logged: list[dict] = []
    monkeypatch.setattr(Tracker, "log", lambda self, record, artifacts: logged.append(record) or ("id",))
    calls: list[int] = []

    real_probe_job = getattr(fit._probe_job, "real", fit._probe_job)  # unpatched in a 2nd call

    class Probing:
        def __init__(self, value, probe):
            self.value = value
            spec = job_spec(probe.conf, probe.arch, tmp_path)
            spec.scenario = "fit"
            self.name = records.run_name(spec, probe.conf.size.name)  # as Job.run names it

        def run(self, child_dir, parent, devices, scenario=None, repeat=None, tags=None):
            # the worker writes its spec.json into the folder: it must exist (issue 60)
            assert Path(child_dir).is_dir(), f"{child_dir} was not created"
            calls.append(self.value)
            if names is not None:
                names.append(self.name)
            result = probe_run(self.value, calls)
            tags(result)
            return "n", result, "id"

    def probe_job(job, axis, value):
        return Probing(value, real_probe_job(job, axis, value))

    probe_job.real = real_probe_job
    monkeypatch.setattr(fit, "_probe_job", probe_job)
    _, outcome, _ = fit.run(job, tmp_path, None)
    return outcome, logged, calls


def fits(value: int) -> Result:
    return Result("r", status="FINISHED", metrics={"peak_rss_mib": 300.0 + 20 * value,
                                                   "throughput_samples_per_s": 9.0})


def test_an_error_in_the_fit_search_closes_its_parent_failed(tmp_path, monkeypatch):
    """Case 4: an unexpected error in fit's search left its parent RUNNING for ever."""
    def probe(value, calls):
        if len(calls) == 2:
            raise RuntimeError("a bug")
        return fits(value)

    outcome, logged, calls = fit_with(tmp_path, monkeypatch, probe)
    assert outcome.status == "FAILED" and outcome.error == "the search failed: RuntimeError: a bug"
    assert [r["status"] for r in logged] == ["RUNNING", "FAILED"]
    assert logged[-1]["tags"]["fxtrack.error"] == outcome.error
    assert logged[-1]["metrics"]["max_batch_size"] == calls[0]  # what was probed is kept


KILLED_FROM_OUTSIDE = "worker killed by SIGKILL (out of memory? the kernel's OOM killer sends SIGKILL)"


def test_a_probe_killed_without_memory_pressure_is_probed_again(tmp_path, monkeypatch):
    """Case 5: one probe killed from outside counted as 'does not fit' and changed the answer,
    though the probes before it had fitted at ~500 MiB of an 8 GiB budget."""
    def probe(value, calls):
        if len(calls) == 2:  # the second probe's first try: a stray SIGKILL
            return Result("r", status="FAILED", error=KILLED_FROM_OUTSIDE)
        return fits(value)

    undisturbed, _, _ = fit_with(tmp_path / "a", monkeypatch, lambda value, calls: fits(value))
    outcome, _, calls = fit_with(tmp_path / "b", monkeypatch, probe)
    assert calls[2] == calls[1]  # the same value again
    assert outcome.status == "FINISHED"
    assert outcome.metrics["max_batch_size"] == undisturbed.metrics["max_batch_size"]
    assert calls[1] < outcome.metrics["max_batch_size"]  # a miss would have ended below it


def test_a_probe_killed_twice_without_memory_pressure_names_the_uncertainty(tmp_path,
                                                                            monkeypatch, capsys):
    killed_at: list[int] = []

    def probe(value, calls):
        if len(calls) in (2, 3):
            killed_at.append(value)
            return Result("r", status="FAILED", error=KILLED_FROM_OUTSIDE)
        return fits(value)

    outcome, logged, calls = fit_with(tmp_path, monkeypatch, probe)
    assert len(calls) == 3 and killed_at == [calls[1]] * 2  # the search stopped there
    assert outcome.status == "FAILED"
    assert f"batch_size={calls[1]} was stopped twice" in outcome.error
    assert "the answer is uncertain (at least" in outcome.error
    assert logged[-1]["status"] == "FAILED"
    # the terminal says why the search ended, not only the parent's tag (issue 60)
    assert f"search stopped: batch_size={calls[1]} was stopped twice" in capsys.readouterr().out


# Fault injection into a real orchestrator process (not its workers): Job.run of the cell with
# seed=1 raises, as an orchestrator bug would.
SITECUSTOMIZE = """
import sys
if sys.orig_argv[1:3] == ["-m", "fxtrack"]:
    from fxtrack.orchestrator.job import Job
    run = Job.run
    def broken(self, *args, **kwargs):
        if self.conf.seed == 1:
            raise RuntimeError("an injected bug")
        return run(self, *args, **kwargs)
    Job.run = broken
"""


def test_a_sweep_goes_on_past_a_bad_cell_and_prints_its_closing_table(tmp_path):
    """Case 4: one cell's unexpected error aborted the cells after it, with no closing table."""
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**seed_peak_cache(tmp_path / "cache"), "PYTHONPATH": os.pathsep.join(
        [str(tmp_path / "inject"), os.environ.get("PYTHONPATH", "")])}
    proc = run_fxtrack(tmp_path, "-m", *TINY, "steps=2", "seed=0,1,2", env=env, timeout=900)
    assert proc.returncode == 1, proc.stderr
    assert "fxtrack: job 2: fxtrack failed: RuntimeError: an injected bug" in proc.stderr
    assert "1 of 3 jobs failed" in proc.stderr  # the closing lines, after every cell ran
    runs = store_runs(tmp_path)
    children = {r.data.params["seed"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert sorted(children) == ["0", "1", "2"]
    assert children["0"].info.status == children["2"].info.status == "FINISHED"
    assert children["1"].info.status == "FAILED"  # the bad cell's run says why
    assert children["1"].data.tags["fxtrack.error"] == \
        "fxtrack failed: RuntimeError: an injected bug"
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.status == "FAILED"
    assert list((tmp_path / "home").rglob("*.held-*")) == []  # no fallback left behind


# serve builds at its largest bucket: max_batch=2 is TINY's batch_size=2
SERVE = ["scenario=serve", "scenario.slo.e2e_ms=5000", "scenario.num_requests=4",
         "scenario.max_batch=2"]


@pytest.mark.parametrize("stop", ["sigkill-worker", "sigterm-main"])
def test_a_stopped_rate_search_keeps_its_finished_probes(tmp_path, reaper, stop):
    """Case 2: a serve rate search stopped after finished probe windows left its parent
    FAILED / KILLED with 0 child runs: the probes lived only in the worker's final result.
    Stopped after the first window: a search has at least two (it doubles until one fails), so
    the worker is still serving; after two, a short search had sometimes ended already."""
    # an SLO no probe misses and longer windows: the search doubles on (saturation ends it), so
    # the worker is still serving when the first probe has landed (a short one had ended)
    long_search = [o for o in SERVE if not o.startswith(("scenario.slo.", "scenario.num_"))] + [
        "scenario.slo.e2e_ms=600000", "scenario.num_requests=48"]
    proc = subprocess.Popen([sys.executable, "-m", "fxtrack", *TINY, "steps=2", *long_search],
                            cwd=tmp_path, env=user_env(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    reaper.append(proc)

    def a_probe() -> bool:
        assert proc.poll() is None, f"the run ended before a probe: {proc.stderr.read()}"
        return len(streamed(tmp_path)) >= 1

    wait_for(a_probe, 600, "a finished probe")
    if stop == "sigkill-worker":
        os.kill(worker_pids(tmp_path)[0], signal.SIGKILL)
    else:
        proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    assert code == (1 if stop == "sigkill-worker" else 143), proc.stderr.read()
    finished = len(streamed(tmp_path))
    runs = store_runs(tmp_path)
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.status == ("FAILED" if stop == "sigkill-worker" else "KILLED")
    probes = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(probes) == finished >= 1
    assert {r.info.status for r in probes} == {"FINISHED"}
    assert all(r.data.tags["fxtrack.serve_probe"] in ("pass", "slo", "saturated") for r in probes)
    assert all(r.data.metrics["serve_requests"] > 0 for r in probes)
    assert all(r.info.end_time > r.info.start_time for r in probes)  # case 10: the window's span
    assert worker_pids(tmp_path) == []


def test_a_rate_search_under_a_sigkilled_orchestrator_keeps_its_probes_through_sync(
        tmp_path, reaper):
    """Each probe is held in the spool the moment its window ends: the orchestrator killed
    outright after two probes, ``fxtrack sync`` logs both as child runs of the closed run."""
    proc = subprocess.Popen([sys.executable, "-m", "fxtrack", *TINY, "steps=2", *SERVE],
                            cwd=tmp_path, env=user_env(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    reaper.append(proc)
    wait_for(lambda: proc.poll() is None and len(streamed(tmp_path)) >= 2, 600,
             "two finished probes")
    time.sleep(1.5)  # the orchestrator looks for new probes every half second
    runs = kill_then_sync(proc, tmp_path)
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.status != "RUNNING" and parent.data.tags["fxtrack.scenario"] == "serve"
    probes = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert 2 <= len(probes) <= len(streamed(tmp_path))  # a probe of its last 0.5 s may be gone
    assert {r.info.status for r in probes} == {"FINISHED"}
    assert all(r.data.tags["fxtrack.serve_probe"] in ("pass", "slo", "saturated") for r in probes)
    assert len(runs) == len(probes) + 1  # nothing logged twice, nothing unlinked


def streamed(tmp_path: Path) -> list:
    from fxtrack.worker.protocol import streamed_children

    found = next(tmp_path.glob("outputs/*/*/children.jsonl"), None)
    return streamed_children(found.with_name("result.json")) if found else []


def cell_worker(tmp_path: Path, cell: int) -> list[int]:
    return [pid for pid in worker_pids(tmp_path)
            if f"/{cell}/spec.json" in Path(f"/proc/{pid}/cmdline").read_bytes().decode()]


def test_chaos_sweep_then_resume_leaves_one_finished_run_per_good_cell(tmp_path, reaper):
    """Issue 43's chaos test: 6 cells; cell 1's orchestrator code raises, cell 2's worker is
    SIGKILLed, the orchestrator is SIGKILLed during cell 4; ``fxtrack sync``, then the same
    sweep with resume=true. Every cell that can finish has exactly one FINISHED run, the
    bad and killed cells FAILED runs with their reasons, nothing RUNNING, no process left."""
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = user_env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "inject"), env.get("PYTHONPATH", "")])
    sweep = ["-m", *TINY, "steps=2", "seed=0,1,2,3,4,5"]
    first = subprocess.Popen([sys.executable, "-m", "fxtrack", *sweep], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL,
                             stderr=open(tmp_path / "first.log", "w"))
    reaper.append(first)
    os.kill(wait_for(lambda: cell_worker(tmp_path, 2), 600, "cell 2's worker")[0],
            signal.SIGKILL)
    wait_for(lambda: cell_worker(tmp_path, 4), 600, "cell 4's worker")
    first.kill()
    first.wait(timeout=30)
    wait_for(lambda: not worker_pids(tmp_path), 10, "cell 4's worker to stop with it")
    assert sync(tmp_path).returncode == 0
    second = run_fxtrack(tmp_path, *sweep, "resume=true", env=env, timeout=900)
    assert second.returncode == 1, second.stderr  # cell 1 fails again
    assert second.stderr.count("skipped (resume=true)") == 2, second.stderr  # cells 0 and 3
    runs = store_runs(tmp_path)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    cells = [r for r in runs if "seed" in r.data.params and "fxtrack.sweep" not in r.data.tags]
    finished = sorted(r.data.params["seed"] for r in cells if r.info.status == "FINISHED")
    assert finished == ["0", "2", "3", "4", "5"]
    errors = {(r.data.params["seed"], r.data.tags.get("fxtrack.error", "")) for r in cells
              if r.info.status == "FAILED"}
    assert {seed for seed, _ in errors} == {"1", "2", "4"}
    assert all("an injected bug" in why for seed, why in errors if seed == "1")
    assert any("killed by SIGKILL" in why for seed, why in errors if seed == "2")
    assert any("orchestrator was gone" in why for seed, why in errors if seed == "4")
    assert processes_mentioning(str(tmp_path)) == []


def test_fits_parent_and_its_first_probe_have_different_names(tmp_path, monkeypatch):
    """Case 10: with batch_size=8 steps=3 given, the parent and its first probe (batch 8, 3
    steps) were both named torch-vit-fit-fp32-x1-tiny-b8-s3."""
    names: list[str] = []
    _, logged, calls = fit_with(tmp_path, monkeypatch, lambda value, calls: fits(value),
                                "batch_size=8", "steps=3", names=names)
    assert calls[0] == 8 and names[0] == "torch-vit-fit-fp32-x1-tiny-b8-s3"
    assert logged[0]["run_name"] == "torch-vit-fit-fp32-x1-tiny"  # as docs/contract.md names it
    assert logged[0]["run_name"] not in names


def test_the_health_url_has_one_slash():
    """Case 10: a tracking URI ending in '/' was reported as '...//health'."""
    from fxtrack.tracking import health
    from fxtrack.tracking.errors import ServerUnreachable

    with pytest.raises(ServerUnreachable) as e:
        health._health("http://127.0.0.1:9/")
    assert "http://127.0.0.1:9/health" in str(e.value) and "//health" not in str(e.value)
    health._DOWN.clear()


def test_a_fit_under_a_sigkilled_orchestrator_is_closed_by_sync(tmp_path, reaper):
    """Case 1 for a search's parent: fit's parent (created RUNNING before its probes) stayed
    RUNNING for ever when its orchestrator was killed outright."""
    proc = subprocess.Popen([sys.executable, "-m", "fxtrack", *TINY, "steps=2",
                             "scenario=fit", "scenario.memory_gib=8"], cwd=tmp_path,
                            env=user_env(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    reaper.append(proc)
    wait_for(lambda: worker_pids(tmp_path), 300, "the first probe's worker")
    runs = kill_then_sync(proc, tmp_path)
    assert sorted(r.info.status for r in runs) == ["FAILED", "FAILED"]  # the parent, its probe
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    assert parent.data.tags["fxtrack.scenario"] == "fit"
    assert "orchestrator was gone" in parent.data.tags["fxtrack.error"]


def test_a_model_name_with_a_slash_makes_a_pareto_chart_file(tmp_path, monkeypatch):
    """Case 7: the Pareto chart skipped the slug the other charts use: a model named
    'org/t5' made a path into a folder that does not exist (a traceback)."""
    import types

    import pandas as pd

    from fxtrack.report import pareto

    drawn: list[Path] = []
    point = types.SimpleNamespace(x=1.0, y=2.0, framework="torch")
    monkeypatch.setattr(pareto.samples, "configs",
                        lambda frame: pd.DataFrame({"model": ["org/t5"], "label": ["org/t5"]}))
    monkeypatch.setattr(pareto, "points", lambda frame, model, axes, label=None: [point])
    monkeypatch.setattr(pareto, "_draw", lambda found, marks, axes, title, path: drawn.append(path))
    pareto.charts(pd.DataFrame(), tmp_path)
    assert drawn and all(p.parent == tmp_path and "org_t5" in p.name for p in drawn)


def test_report_md_escapes_what_the_page_escapes(tmp_path):
    """Case 7: report.md passed a name's raw HTML through (Markdown renders it), which the HTML
    page escapes; a | in a name ended its table cell."""
    from fxtrack.report import render
    from fxtrack.report.charts import Chart
    from fxtrack.report.tables import Section, Table

    bad = "<script>alert(1)</script>|x"
    (tmp_path / "c.png").write_bytes(b"\x89PNG\r\n")  # the page embeds the file
    chart = Chart(title=f"throughput of {bad}", path=tmp_path / "c.png", caption="")
    report = render.Report(f"fxtrack report: {bad}", [f"experiment {bad!r}"],
                           [Section(f"Models {bad}", [Table(f"t {bad}", ["model", "figure"],
                                                            [[bad, "1.0"]])])], [chart])
    md = render.markdown(report)
    page = render.html_page(report)
    assert "<script>" not in md and "<script>" not in page
    assert md.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 6  # title, meta, chart, 3 in the tables
    row = next(line for line in md.splitlines() if line.startswith("| &lt;script"))
    assert row.count(" | ") == 1 and "\\|x" in row  # the | stays inside its cell


def parent_with(tmp_path, monkeypatch, second, *overrides: str):
    """A scaling run or repeats in this process on a tiny ViT: the first child finishes, the
    second raises ``second``; (what escaped, the logged records, the children run)."""
    from hydra import compose, initialize_config_dir

    from fxtrack.cli import CONF_DIR
    from fxtrack.config import register
    from fxtrack.config.validate import validate
    from fxtrack.orchestrator import repeats
    from fxtrack.scenarios.scaling import driver as scaling
    from fxtrack.orchestrator.job import Job

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "framework=torch", "model=vit", "size=tiny", "hardware=cpu",
            f"tracking.uri=sqlite:///{tmp_path / 'm.db'}", *overrides])
        conf, arch = validate(cfg)
    job = Job(cfg, conf, arch, str(tmp_path))
    logged: list[dict] = []
    monkeypatch.setattr(Tracker, "log", lambda self, record, artifacts: logged.append(record) or ("id", "store"))
    children: list[int] = []

    def run(self, job_dir, parent, devices, scenario=None, repeat=None, tags=None):
        children.append(devices if repeat is None else repeat)
        if len(children) == 2:
            raise second
        return "child", Result("r", status="FINISHED",
                               metrics={"throughput_samples_per_s": 10.0}), "id"

    monkeypatch.setattr(Job, "run", run)
    escaped = None
    try:
        if conf.scenario.name == "scaling":
            scaling.run(job, tmp_path, None)
        else:
            repeats.run_all(job, tmp_path)
    except BaseException as e:  # noqa: BLE001 - what the caller would see
        escaped = e
    return escaped, logged, children


@pytest.mark.parametrize("overrides", [("scenario=scaling", "devices=2"), ("repeats=3",)],
                         ids=["scaling", "repeats"])
@pytest.mark.parametrize("second, status", [(RuntimeError("a bug"), "FAILED"),
                                            (SystemExit(143), "KILLED")], ids=["error", "signal"])
def test_scaling_and_repeats_close_their_parent_on_any_exception(tmp_path, monkeypatch,
                                                                 overrides, second, status):
    """Issue 43: every orchestrator path closes its runs on any exception, with what its
    finished children measured; a signal still ends the process."""
    escaped, logged, children = parent_with(tmp_path, monkeypatch, second, *overrides)
    assert children[0] in (0, 1) and len(children) == 2  # stopped at the second child
    assert [r["status"] for r in logged] == ["RUNNING", status]  # opened, then closed
    closed = logged[-1]
    if status == "FAILED":
        assert "RuntimeError: a bug" in closed["tags"]["fxtrack.error"]
        # scaling's parent answers FAILED; repeats' cell fails with the error itself
        assert escaped is (second if "repeats=3" in overrides else None)
    else:
        assert closed["tags"]["fxtrack.error"] == "interrupted" and escaped is second
    figure = ("throughput_samples_per_s_x1" if "scenario=scaling" in overrides
              else "throughput_samples_per_s")
    assert closed["metrics"][figure] == 10.0  # the finished child's figure is kept


def test_a_jobs_fallback_is_held_before_its_worker_starts(tmp_path, monkeypatch, isolated_store):
    """The fallback in the spool exists the moment the worker starts (a kill then must find
    it: it once waited for MLflow's import, 0.8 s with the worker already running); MLflow's
    run-context tags join the same entry while the worker builds; the log drops it."""
    from hydra import compose, initialize_config_dir

    from fxtrack.cli import CONF_DIR
    from fxtrack.config import register
    from fxtrack.config.validate import validate
    from fxtrack.orchestrator import job as job_module
    from fxtrack.tracking import records, spool

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "framework=torch", "model=vit", "size=tiny", "hardware=cpu",
            f"tracking.uri=sqlite:///{tmp_path / 'm.db'}"])
        conf, arch = validate(cfg)
    job = job_module.Job(cfg, conf, arch, str(tmp_path))
    monkeypatch.setattr(Tracker, "log", lambda self, record, artifacts: ("id", "store"))
    monkeypatch.setattr(Tracker, "load", lambda self: None)
    seen: dict[str, list] = {}

    def held() -> list[dict]:
        root = spool.spool_dir()
        return [json.loads((p / spool.RECORD).read_text()) for p in
                (root.iterdir() if root.is_dir() else ()) if ".held-" in p.name]

    def run_worker(spec, job_dir, python, timeout_s, meanwhile=None, while_running=None):
        seen["started"] = held()  # what a kill at the worker's start would leave
        meanwhile()
        seen["built"] = held()
        return Result(spec.result_id, status="FAILED", error="stand-in worker")

    monkeypatch.setattr(job_module, "run_worker", run_worker)
    (tmp_path / "job").mkdir()
    job.run(tmp_path / "job", None, 1)
    started, built = seen["started"], seen["built"]
    assert [r["status"] for r in started] == ["FAILED"] and len(built) == 1
    assert started[0]["tags"]["fxtrack.error"] == records.GONE
    assert started[0]["result_id"] == built[0]["result_id"]  # one entry, rewritten
    assert "mlflow.user" not in started[0]["tags"] and "mlflow.user" in built[0]["tags"]
    assert held() == []  # logged: the fallback dropped
