"""Issue 14 ("a team server you can trust"), the parts that need no benchmark worker: credential
handling, the spool's claims and quarantine, error classification, parent links, a hanging
server, bad input, MLflow's own tags and times. Synthetic records stand in for results."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")

from mlflow.entities import ViewType  # noqa: E402

from fxtrack import environment  # noqa: E402
from fxtrack.orchestrator import runner  # noqa: E402
from fxtrack.tracking import errors, health, records, spool, target, writer  # noqa: E402
from fxtrack.tracking.runs import WRITER_TAG, client_for, experiment_id  # noqa: E402
from conftest import fxtrack_env, run_fxtrack  # noqa: E402

PLANTED = "planted-secret-" + uuid.uuid4().hex[:12]


@pytest.fixture
def home(isolated_store):
    health._DOWN.clear()
    yield isolated_store
    health._DOWN.clear()


def synthetic(uri: str, parent: str | None = None, kind: str = "job", status: str = "FINISHED",
              params: int = 3) -> dict:
    """A record as the orchestrator spools it, for a 10 s run that ended 5 s ago."""
    end = int(time.time() * 1000) - 5000
    series = {"step_time_ms": [400.0, 300.0, 300.0], "loss": [2.0, 1.5, 1.0]}
    return {"kind": kind, "result_id": uuid.uuid4().hex, "uri": uri, "experiment": "fxtrack",
            "experiment_id": None, "adopt_run_id": None, "run_name": f"{kind}-{uuid.uuid4().hex[:4]}",
            "parent_result_id": parent, "start_time_ms": end - 10_000, "end_time_ms": end,
            "status": status, "params": {f"p{i}": i for i in range(params)},
            "tags": records.run_tags({"fxtrack.framework": "torch"}),
            "metrics": {"throughput_samples_per_s": 5.0}, "series": series,
            "series_times_ms": records.series_times(series, end)}


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def runs(uri: str, experiment: str = "fxtrack"):
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp else []


# --- 1-3: credentials --------------------------------------------------------------------------

def test_uri_credentials_move_to_mlflow_variables_before_hydra_sees_them():
    env = {"MLFLOW_TRACKING_URI": f"https://bob:{PLANTED}@mlflow.example:443/"}
    argv = ["fxtrack", "-m", f"tracking.uri=http://alice:p%40{PLANTED}@127.0.0.1:5000", "seed=1"]
    environment.secure_process(argv, env)
    assert argv[2] == "tracking.uri=http://127.0.0.1:5000" and argv[3] == "seed=1"
    assert env["MLFLOW_TRACKING_URI"] == "https://mlflow.example:443/"
    # the environment's own credentials were there first and win; none stays in a URI
    assert env["MLFLOW_TRACKING_USERNAME"] == "bob" and env["MLFLOW_TRACKING_PASSWORD"] == PLANTED
    fresh: dict = {}
    environment.secure_process(["x", f"tracking.uri=http://alice:p%40{PLANTED}@h:1"], fresh)
    assert fresh == {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": f"p@{PLANTED}"}


def test_hydra_never_prints_a_uri_password(tmp_path):
    proc = run_fxtrack(tmp_path, f"tracking.uri=http://u:{PLANTED}@127.0.0.1:9", "--cfg", "job",
                       timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "uri: http://127.0.0.1:9" in proc.stdout
    assert PLANTED not in proc.stdout + proc.stderr


def test_a_sweep_keeps_uri_passwords_out_of_hydra_files_the_spool_and_the_terminal(tmp_path):
    """Server down, worker failing fast: everything the sweep wrote stays on disk to scan."""
    failing = _script(tmp_path / "python", "exit 3")
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # a port nobody listens on
    port = dead.getsockname()[1]
    dead.close()
    proc = run_fxtrack(tmp_path, "-m", f"tracking.uri=http://alice:{PLANTED}@127.0.0.1:{port}",
                       f"framework.python={failing}", "seed=0,1",
                       env={"MY_API_TOKEN": PLANTED}, timeout=300)
    assert proc.returncode == 1 and "only in the local spool" in proc.stderr
    assert PLANTED not in proc.stdout + proc.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "python"]
    assert any(p.name == "overrides.yaml" for p in written)
    assert len(list((tmp_path / "home" / "spool").iterdir())) == 3
    for path in written:
        assert PLANTED not in path.read_text(errors="replace"), path


def test_logged_overrides_are_redacted():
    out = records.redact_overrides([f"tracking.uri=http://u:{PLANTED}@h:1,http://h:2",
                                    f"+db_password={PLANTED}", "model=vit"])
    assert out == ["tracking.uri=http://h:1,http://h:2", "+db_password=***", "model=vit"]


def test_environment_json_records_an_allowlist_without_credentials(monkeypatch):
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", f"postgresql+psycopg2://u:{PLANTED}@db:5432/reg")
    monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", f"http://key:{PLANTED}@minio:9000")
    monkeypatch.setenv("XLA_FLAGS", f"--xla_dump_to=s3://k:{PLANTED}@bucket/x")
    monkeypatch.setenv("SOME_SERVICE_URL", f"https://u:{PLANTED}@svc")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    text = records.environment_json()
    env = json.loads(text)["environment"]
    assert PLANTED not in text
    assert env["MLFLOW_REGISTRY_URI"] == "postgresql+psycopg2://db:5432/reg"
    assert env["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert env["OMP_NUM_THREADS"] == "2" and "SOME_SERVICE_URL" not in env


def test_worker_gets_no_secret_and_its_uploaded_log_is_scrubbed(tmp_path):
    """A framework.python wrapper that prints its environment (then fails fast)."""
    wrapper = _script(tmp_path / "env-python", "env; echo token=$MY_API_TOKEN; exit 3")
    env = {"MY_API_TOKEN": PLANTED, "DB_PASSWORD": PLANTED,
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
           "EXTRA_URL": f"http://user:{PLANTED}@example.org"}
    proc = run_fxtrack(tmp_path, "framework=torch", "size=tiny", f"framework.python={wrapper}",
                       env=env, timeout=300)
    assert proc.returncode == 1 and PLANTED not in proc.stdout + proc.stderr
    log = (next(tmp_path.glob("outputs/*/*/worker.log"))).read_text()
    assert "token=\n" in log and PLANTED not in log  # the worker never had it
    (run,) = runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    path = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").download_artifacts(
        run.info.run_id, "worker.log", str(tmp_path / "dl"))
    assert PLANTED not in Path(path).read_text()


def test_log_tail_masks_secret_values_of_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", PLANTED)
    log = tmp_path / "worker.log"
    log.write_text(f"HF_TOKEN={PLANTED}\nuri postgresql://u:pw@db/x\n")
    tail = runner.log_tail(log)
    assert PLANTED not in tail and "u:pw@" not in tail and "HF_TOKEN=***" in tail


# --- 4, 6, 8: the spool ---------------------------------------------------------------------------

def _sync_procs(home: Path, n: int, extra_env: dict | None = None):
    env = fxtrack_env(home.parent, {"FXTRACK_HOME": str(home), **(extra_env or {})})
    return [subprocess.Popen([sys.executable, "-m", "fxtrack", "sync"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(n)]


def test_concurrent_syncs_land_each_result_exactly_once(home, tmp_path):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    parent = synthetic(uri, kind="sweep", status="FINISHED")
    ids = {parent["result_id"]}
    spool.write(parent, {})
    for _ in range(5):
        rec = synthetic(uri, parent=parent["result_id"])
        ids.add(rec["result_id"])
        spool.write(rec, {"result.json": "{}"})
    procs = _sync_procs(home, 4)
    outs = [p.communicate(timeout=300) for p in procs]
    assert all("Traceback" not in err for _, err in outs), outs
    last = _sync_procs(home, 1)[0].communicate(timeout=300)  # whatever a busy store left
    assert "Traceback" not in last[1]
    landed = runs(uri)
    assert sorted(r.data.tags["fxtrack.result_id"] for r in landed) == sorted(ids)
    assert all(r.info.status == "FINISHED" for r in landed)
    (p,) = [r for r in landed if r.data.tags["fxtrack.result_id"] == parent["result_id"]]
    assert {r.data.tags.get("mlflow.parentRunId") for r in landed if r is not p} == {p.info.run_id}
    assert list(spool.pending()) == [] and not list(spool.spool_dir().glob("*.claim-*"))


def test_a_running_run_of_a_live_writer_is_never_deleted(home, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rec = synthetic(uri)
    client = client_for(uri)
    exp = experiment_id(client, "fxtrack", uri)
    live = client.create_run(exp, tags={"fxtrack.result_id": rec["result_id"],
                                        WRITER_TAG: f"{socket.gethostname()}:1:"
                                                           f"{int(time.time() * 1000)}"})
    entry = spool.write(rec, {})
    with pytest.raises(target.TrackingUnavailable, match="being written by another process"):
        writer.deliver(entry)
    assert client.get_run(live.info.run_id).info.lifecycle_stage == "active"
    assert [p.name for p in spool.pending()] == [rec["result_id"]]  # released, not lost
    # the same leftover from a writer that died: replaced by one complete run
    client.set_tag(live.info.run_id, WRITER_TAG, f"{socket.gethostname()}:99999999:1")
    run_id = writer.deliver(entry)
    assert client.get_run(live.info.run_id).info.lifecycle_stage == "deleted"
    assert [r.info.run_id for r in runs(uri)] == [run_id]


def test_an_entry_logged_completely_before_is_not_logged_again(home, tmp_path):
    """The run is created before the check for earlier runs of its result (one search per
    result): a replay finds the finished run, and the run it had just created is deleted."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rec = synthetic(uri)
    client = client_for(uri)
    exp = experiment_id(client, "fxtrack", uri)
    done = client.create_run(exp, tags={"fxtrack.result_id": rec["result_id"],
                                        WRITER_TAG: f"{socket.gethostname()}:1:1"})
    client.set_terminated(done.info.run_id, "FINISHED")
    assert writer.deliver(spool.write(rec, {"result.json": "{}"})) == done.info.run_id
    assert [r.info.run_id for r in runs(uri)] == [done.info.run_id]
    assert list(spool.pending()) == []
    deleted = client.search_runs([exp], run_view_type=ViewType.DELETED_ONLY)
    assert [r.data.tags["fxtrack.result_id"] for r in deleted] == [rec["result_id"]]
    assert client.list_artifacts(done.info.run_id) == []  # nothing logged into it again


def test_a_claimed_entry_is_not_delivered_twice_and_dead_claims_come_back(home, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    entry = spool.write(synthetic(uri), {})
    claimed = spool.claim(entry)
    assert claimed is not None and spool.claim(entry) is None
    with pytest.raises(errors.EntryBusy):
        writer.deliver(entry)
    dead = claimed.rename(claimed.with_name(claimed.name.rsplit("-", 1)[0] + "-99999999"))
    assert [p.name for p in spool.pending()] == [entry.name] and not dead.exists()


def test_corrupt_entries_are_set_aside_and_the_rest_upload(home, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for _ in range(3):
        spool.write(synthetic(uri), {})
    broken = spool.spool_dir() / "broken"
    broken.mkdir()
    (broken / spool.RECORD).write_text("{not json")
    proc = _sync_procs(home, 1)[0]
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "Traceback" not in err
    assert "3 uploaded, 0 still spooled" in out and "1 unreadable set aside" in out
    assert len(runs(uri)) == 3
    (bad,) = spool.quarantined()
    assert "unreadable record" in (bad / "reason.txt").read_text()


def test_four_first_runs_on_a_new_sqlite_store_all_land(home, tmp_path):
    uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    code = ("import sys; from fxtrack.tracking import spool, writer\n"
            "entry = spool.write(__import__('json').loads(sys.argv[1]), {})\n"
            "print(writer.deliver(entry))\n")
    env = fxtrack_env(tmp_path, {"FXTRACK_HOME": str(home)})
    procs = [subprocess.Popen([sys.executable, "-c", code, json.dumps(synthetic(uri))], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [e[-800:] for _, e in outs]
    assert len(runs(uri)) == 4


def test_a_new_sqlite_store_appears_whole_and_opens_with_sqlites_defaults(home, tmp_path,
                                                                        monkeypatch):
    """A new store is built unjournaled beside its name and renamed onto it: a build cut short
    leaves no store and no part file, a stale part of a killed build is removed, and the store
    then writes with SQLite's own journal and fsyncs (nothing of the build's settings leaks)."""
    import sqlite3

    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from fxtrack.tracking import runs

    db = tmp_path / "new" / "mlflow.db"
    uri = f"sqlite:///{db}"
    real_init = SqlAlchemyStore.__init__

    def cut_short(self, db_uri, *args, **kwargs):
        real_init(self, db_uri, *args, **kwargs)
        raise RuntimeError("the build is cut short")

    monkeypatch.setattr(SqlAlchemyStore, "__init__", cut_short)
    with pytest.raises(RuntimeError, match="cut short"):
        client_for(uri)
    assert sorted(p.name for p in db.parent.iterdir()) == ["mlflow.db.lock"]  # no store, no part
    monkeypatch.setattr(SqlAlchemyStore, "__init__", real_init)

    (db.parent / ".mlflow.db.building-1").write_text("a killed build's part")
    runs._CLIENTS.pop(uri, None)
    client = client_for(uri)
    assert sorted(p.name for p in db.parent.iterdir()) == ["mlflow.db", "mlflow.db.lock"]
    (default,) = client.search_experiments()  # its artifacts beside the store, as before
    assert default.artifact_location == (db.parent / "mlruns" / "0").as_uri()
    with SqlAlchemyStore._engine_map[uri].connect() as conn:  # the store's own pooled connection
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL, SQLite's default
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "delete"
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_locked_sqlite_store_keeps_the_entry_without_a_traceback(home, tmp_path):
    import sqlite3

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client_for(uri).search_experiments()  # the store exists
    entry = spool.write(synthetic(uri), {})
    lock = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")  # another program holds the database
    try:
        with pytest.raises(target.TrackingUnavailable) as caught:
            writer.deliver(entry)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert not isinstance(caught.value, target.TrackingRejected)
    assert [p.name for p in spool.pending()] == [entry.name]
    writer.deliver(entry)  # and once it is free, the run lands
    assert len(runs(uri)) == 1


def test_an_unwritable_spool_stops_before_the_worker(tmp_path):
    marker = tmp_path / "worker-started"
    python = _script(tmp_path / "python", f"touch {marker}")
    (tmp_path / "home").write_text("a file, not a directory")
    proc = run_fxtrack(tmp_path, f"framework.python={python}", timeout=300)
    assert proc.returncode == 2 and "not writable" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()


def test_a_child_keeps_its_parent_when_the_parent_was_only_spooled(home, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = synthetic(uri, kind="sweep", status="RUNNING")
    spool.write(parent, {})
    child = synthetic(uri, parent=parent["result_id"])
    run_id = writer.deliver(spool.write(child, {}))
    client = mlflow.MlflowClient(uri)
    linked = client.get_run(run_id).data.tags["mlflow.parentRunId"]
    assert client.get_run(linked).data.tags["fxtrack.result_id"] == parent["result_id"]
    assert list(spool.pending()) == []


# --- 7, 9: classification, validation, a hanging server ---------------------------------------------

def test_errors_are_classified_by_http_status_not_by_text():
    from mlflow.exceptions import MlflowException, RestException

    run_403 = MlflowException("Run 'a403b' not reachable", error_code="INTERNAL_ERROR")
    error = errors.classify(run_403, {"experiment": "fxtrack"})
    assert type(error) is target.TrackingUnavailable and "HTTP 403" not in str(error)
    denied = errors.classify(RestException({"error_code": "PERMISSION_DENIED", "message": "no"}),
                             {"experiment": "x"})
    assert isinstance(denied, target.TrackingRejected) and "HTTP 403" in str(denied)
    gone = errors.classify(RestException({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "?"}),
                           {"experiment": "x"})
    assert isinstance(gone, target.TrackingRejected)
    assert not isinstance(errors.classify(KeyError("x"), {}), target.TrackingRejected)


@pytest.mark.parametrize("uri, experiment, message", [
    ("ftp://example.org/x", "fxtrack", "is not a tracking URI"),
    ("http:///nohost", "fxtrack", "names no host"),
    ("sqlite:///{tmp}/m.db", " ", "tracking.experiment is empty"),
])
def test_permanent_target_problems_are_found_before_work(tmp_path, uri, experiment, message):
    with pytest.raises(target.TrackingRejected, match=message):
        writer.check_target(uri.format(tmp=tmp_path), experiment)


def test_a_deleted_experiment_stops_a_run_before_the_worker(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = client_for(uri)
    client.delete_experiment(client.create_experiment("gone"))
    marker = tmp_path / "worker-started"
    python = _script(tmp_path / "python", f"touch {marker}")
    proc = run_fxtrack(tmp_path, "tracking.experiment=gone", f"framework.python={python}",
                       env={"MLFLOW_TRACKING_URI": uri}, timeout=300)
    assert proc.returncode == 2 and "is deleted: restore it" in proc.stderr
    assert not marker.exists() and not list((tmp_path / "home" / "spool").iterdir())


@pytest.fixture
def silent_server():
    """Accepts connections, never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                pass
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    sock.close()


def test_a_hanging_server_costs_one_short_probe(home, silent_server, monkeypatch):
    monkeypatch.setattr(health, "PROBE_TIMEOUT_S", 1.0)
    entries = [spool.write(synthetic(silent_server), {}) for _ in range(3)]
    started = time.monotonic()
    for entry in entries:
        with pytest.raises(target.TrackingUnavailable, match="no answer from"):
            writer.deliver(entry)
    assert time.monotonic() - started < 10  # not 3 x (3 x 15 s); bound is generous, not a benchmark
    assert len(list(spool.pending())) == 3


# --- 10: bad input -----------------------------------------------------------------------------

def test_an_unknown_key_is_rejected_naming_the_closest_one(tmp_path):
    proc = run_fxtrack(tmp_path, "+batchsize=8", timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "unknown config key 'batchsize'; did you mean batch_size?" in proc.stderr
    proc = run_fxtrack(tmp_path, "+model.layer=2", timeout=300)
    assert proc.returncode == 2 and "did you mean model.layers?" in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_warmup_steps_zero_is_a_valid_config():
    from test_config import composed

    from fxtrack.config.validate import validate

    conf, _ = validate(composed("warmup_steps=0"))
    assert conf.warmup_steps == 0


def test_a_worker_traceback_stays_in_the_log_unless_verbose(capfd):
    text = (b"starting\nTraceback (most recent call last):\n  File \"x.py\", line 1\n    boom()\n"
            b"RuntimeError: CUDA out of memory\n\nDuring handling of the above exception:\n"
            b"Traceback (most recent call last):\n  File \"y\"\nValueError: again\ndone\n")
    quiet, loud = io.BytesIO(), io.BytesIO()
    runner._tee(io.BufferedReader(io.BytesIO(text)), quiet, True, True)
    shown = capfd.readouterr().err
    assert quiet.getvalue() == text  # worker.log keeps everything
    assert shown.splitlines() == ["starting", "[fxtrack] worker traceback kept in worker.log "
                                  "(verbose=true shows it)", "", "done"]
    runner._tee(io.BufferedReader(io.BytesIO(text)), loud, True, False)
    assert "RuntimeError: CUDA out of memory" in capfd.readouterr().err


# --- 5: signals --------------------------------------------------------------------------------

@pytest.mark.parametrize("sweep, sig, code", [(True, signal.SIGINT, 130),
                                               (False, signal.SIGTERM, 143)])
def test_a_signal_stops_the_worker_and_closes_the_sweep_killed(tmp_path, sweep, sig, code):
    pidfile = tmp_path / "worker.pid"
    python = _script(tmp_path / "python", f"echo $$ > {pidfile}; echo worker-up; exec sleep 120")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = fxtrack_env(tmp_path, {"MLFLOW_TRACKING_URI": uri})
    args = ["-m", "seed=0,1"] if sweep else []
    proc = subprocess.Popen([sys.executable, "-m", "fxtrack", *args, f"framework.python={python}"],
                            cwd=tmp_path, env=env, stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "worker-up" in line:
            break
    proc.send_signal(sig)
    err = "".join(lines) + proc.stderr.read()
    assert proc.wait(timeout=60) == code, err
    assert "Traceback" not in err
    worker = int(pidfile.read_text())
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)
    landed = runs(uri)
    assert len(landed) == (2 if sweep else 1)  # the sweep's parent and the job that was running
    assert all(r.info.status == "KILLED" for r in landed)
    (job,) = [r for r in landed if "fxtrack.error" in r.data.tags]
    assert job.data.tags["fxtrack.error"].startswith("interrupted by SIG")


# --- 11, 12: MLflow's conventions ----------------------------------------------------------------

def test_runs_carry_mlflow_standard_tags_and_their_real_times(home, tmp_path):
    uri = f"sqlite:///{tmp_path / 'db' / 'mlflow.db'}"
    rec = synthetic(uri, params=250)  # more than one log_batch: MLflow splits it
    run_id = writer.deliver(spool.write(rec, {"result.json": "{}"}))
    client = mlflow.MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.data.tags["mlflow.user"] and run.data.tags["mlflow.source.name"]
    assert run.data.tags["mlflow.source.type"] == "LOCAL" and run.data.tags["fxtrack.host"]
    assert (run.info.start_time, run.info.end_time) == (rec["start_time_ms"], rec["end_time_ms"])
    assert len(run.data.params) == 250
    stamps = [m.timestamp for m in client.get_metric_history(run_id, "step_time_ms")]
    end = rec["end_time_ms"]
    assert stamps == [end - 600, end - 300, end]  # each step ended at its own time
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.artifact_location == (tmp_path / "db" / "mlruns" / exp.experiment_id).as_uri()
    assert run.info.artifact_uri.startswith(exp.artifact_location + "/")


def test_config_flattening():
    assert records.flatten({"model": {"layers": 2, "name": "vit"}, "seed": 0, "tracking":
                            {"uri": None}}) == {"model.layers": 2, "model.name": "vit", "seed": 0,
                                                "tracking.uri": None}
    # deeper levels joined too; an empty mapping gives no key, a list stays one value
    assert records.flatten({"a": {"b": {"c": [1, 2]}, "d": {}}, "e": []}) == {"a.b.c": [1, 2],
                                                                             "e": []}


def test_report_finds_the_runs_mlflow_run_made_in_its_default_experiment(tmp_path):
    from fxtrack.tracking import reader

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = client_for(uri)
    project = {"mlflow.source.type": "PROJECT"}
    client.create_run("0", tags=dict(project, **{"fxtrack.framework": "torch"}))  # mlflow run
    client.create_run("0", tags=project)  # somebody else's project: not fxtrack's
    client.create_run("0", tags={"fxtrack.framework": "tensorflow"})  # not a project run
    client.create_run(experiment_id(client, "fxtrack", uri),
                      tags={"fxtrack.framework": "jax"})
    frame = reader.load_runs(uri, "fxtrack")
    assert sorted(frame["tags.fxtrack.framework"]) == ["jax", "torch"]
    assert len(reader.load_runs(uri, "fxtrack", "tags.`fxtrack.framework` = 'torch'")) == 1


def test_sigterm_outside_a_worker_run_leaves_no_child_behind(tmp_path):
    """Between worker runs (a peak-calibration probe, an upload) SIGTERM unwinds the orchestrator
    (exit 143, no traceback) and subprocess.run kills the child it was waiting on."""
    pidfile, child = tmp_path / "child.pid", tmp_path / "child.py"
    child.write_text(f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
                     "time.sleep(60)\n")
    code = ("import subprocess, sys\n"
            "from fxtrack.cli import exit_on_sigterm\n"
            "exit_on_sigterm()\n"
            f"subprocess.run([sys.executable, {str(child)!r}])\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert "Traceback" not in proc.stderr.read()
    pid = int(pidfile.read_text())
    time.sleep(0.5)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
