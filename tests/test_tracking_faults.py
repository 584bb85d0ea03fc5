"""Issue 25 (items 1-7, 11): the tracking path under faults. Synthetic spool entries, a real
``mlflow server`` on loopback, ``fxtrack sync`` run in-process. Filesystem faults (a read-only
mount, a full disk, a mode-000 directory) are simulated by making the OS calls on the paths
concerned fail with that errno: the tests run as root, which real permissions do not bind, and
mounting is not allowed here."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
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
from fxtrack.tracking import errors, health, records, runs, spool, sync, target, writer  # noqa: E402
from servers import MlflowServer  # noqa: E402
from test_tracking_trust import synthetic  # noqa: E402

ARTIFACTS = {"config.yaml": "seed: 0\n", "result.json": "{}", "environment.json": "{}",
             "worker.log": "ok\n"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = MlflowServer(tmp_path_factory.mktemp("faults-server"), workers=1).start()
    yield srv
    srv.stop()


@pytest.fixture
def home(isolated_store):
    health._DOWN.clear()
    health._UP.clear()
    yield isolated_store
    health._DOWN.clear()
    health._UP.clear()


def experiment_runs(uri: str, experiment: str, deleted: bool = False):
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    view = ViewType.ALL if deleted else ViewType.ACTIVE_ONLY
    return client.search_runs([exp.experiment_id], run_view_type=view) if exp else []


def spooled(uri: str, experiment: str, n: int = 1, age_s: float = 0, **changes) -> list[Path]:
    """``n`` job entries with the usual four artifacts, ``age_s`` older than now (the spool
    delivers oldest first)."""
    entries = []
    for _ in range(n):
        rec = dict(synthetic(uri), experiment=experiment, **changes)
        entry = spool.write(rec, ARTIFACTS)
        stamp = time.time() - age_s
        os.utime(entry / spool.RECORD, (stamp, stamp))
        entries.append(entry)
    return entries


def run_sync(capsys, *argv: str) -> tuple[int, str, str]:
    code = sync.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class Faults:
    """OS calls on chosen paths fail with an errno, as the real fault would make them fail.

    ``readonly(root)``: every write under ``root`` (EROFS). ``full(root)``: files under ``root``
    are created but writing data to them fails (ENOSPC), as on a disk with a few KB left.
    ``locked(dir)``: a mode-000 directory without CAP_DAC_OVERRIDE: nothing inside can be read
    or written, and it cannot be moved to another directory (EACCES)."""

    def __init__(self, monkeypatch) -> None:
        self.rules: list[tuple[str, Path, int]] = []
        real_open, real_rename, real_mkdir = io.open, os.rename, os.mkdir
        real_listdir, real_utime, real_unlink = os.listdir, os.utime, os.unlink

        def fail(code: int, path) -> OSError:
            return OSError(code, os.strerror(code), str(path))

        def check(op: str, path, dst=None) -> None:
            if isinstance(path, int):
                return
            p = Path(os.fsdecode(path)).absolute()
            for kind, root, code in self.rules:
                inside = p == root or root in p.parents
                if kind in ("readonly", "full") and op != "read" and inside:
                    if not (kind == "full" and op in ("rename", "unlink", "create", "mkdir",
                                                      "utime")):
                        raise fail(code, p)
                if kind == "locked" and root in p.parents:
                    raise fail(code, p)
                if kind == "locked" and op == "rename" and p == root and dst is not None and \
                        Path(os.fsdecode(dst)).absolute().parent != root.parent:
                    raise fail(code, p)

        def fake_open(file, mode="r", *args, **kw):
            writing = any(c in mode for c in "wax+")
            check("create" if writing else "read", file)
            f = real_open(file, mode, *args, **kw)
            if writing and not isinstance(file, int) and self._full(file):
                return _NoSpace(f)
            return f

        def fake_rename(src, dst, *a, **kw):
            check("rename", src, dst)
            check("rename", dst)
            return real_rename(src, dst, *a, **kw)

        def guarded(op, real):
            def call(path, *a, **kw):
                if op == "mkdir" and os.path.lexists(path):
                    return real(path, *a, **kw)  # EEXIST comes first, as in the kernel
                check(op, path)
                return real(path, *a, **kw)
            return call

        monkeypatch.setattr(io, "open", fake_open)
        monkeypatch.setattr(builtins, "open", fake_open)
        monkeypatch.setattr(os, "rename", fake_rename)
        monkeypatch.setattr(os, "mkdir", guarded("mkdir", real_mkdir))
        monkeypatch.setattr(os, "listdir", guarded("read", real_listdir))
        monkeypatch.setattr(os, "utime", guarded("utime", real_utime))
        monkeypatch.setattr(os, "unlink", guarded("unlink", real_unlink))

    def _full(self, file) -> bool:
        p = Path(os.fsdecode(file)).absolute()
        return any(kind == "full" and (p == root or root in p.parents)
                   for kind, root, _ in self.rules)

    def readonly(self, root: Path) -> None:
        self.rules.append(("readonly", root.absolute(), errno.EROFS))

    def full(self, root: Path) -> None:
        self.rules.append(("full", root.absolute(), errno.ENOSPC))

    def locked(self, directory: Path) -> None:
        self.rules.append(("locked", directory.absolute(), errno.EACCES))

    def clear(self) -> None:
        self.rules.clear()


class _NoSpace:
    """A file opened for writing on a full disk: it exists, every write fails."""

    def __init__(self, f) -> None:
        self._f = f

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fileno(self):
        raise io.UnsupportedOperation("no fast copy on a full disk")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()

    def __getattr__(self, name):
        return getattr(self._f, name)


@pytest.fixture
def faults(monkeypatch):
    return Faults(monkeypatch)


# --- 1, 2: an entry's own fault sets it aside; the others still land -----------------------------

def test_a_bad_entry_is_set_aside_and_the_good_ones_land(home, server, capsys, monkeypatch):
    """A string metric, an unreadable artifact and a record without run_name, spooled before
    three good entries: the three land in one sync, the three bad ones go to bad/ with their
    reasons, the server is not marked down and no run is left RUNNING (issue 25, items 1-2)."""
    exp = f"bad-{uuid.uuid4().hex[:6]}"
    (text_metric,) = spooled(server.url, exp, age_s=30)
    rec = json.loads((text_metric / spool.RECORD).read_text())
    rec["metrics"]["throughput_samples_per_s"] = "fast"
    (text_metric / spool.RECORD).write_text(json.dumps(rec))
    (unreadable,) = spooled(server.url, exp, age_s=20)
    (nameless,) = spooled(server.url, exp, age_s=10)
    rec = json.loads((nameless / spool.RECORD).read_text())
    del rec["run_name"]
    (nameless / spool.RECORD).write_text(json.dumps(rec))
    good = spooled(server.url, exp, n=3)
    # the artifact cannot be read wherever the entry is (claimed, or set aside)
    real_open = io.open

    def no_read(file, mode="r", *a, **kw):
        if not isinstance(file, int) and Path(os.fsdecode(file)).name == "worker.log" and \
                unreadable.name in os.fsdecode(file) and "r" in mode:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
        return real_open(file, mode, *a, **kw)
    monkeypatch.setattr(io, "open", no_read)
    monkeypatch.setattr(builtins, "open", no_read)

    code, out, err = run_sync(capsys)
    assert code == 1 and "3 uploaded, 0 still spooled" in out and "3 set aside" in out, out + err
    landed = experiment_runs(server.url, exp, deleted=True)
    assert sorted(r.data.tags["fxtrack.result_id"] for r in landed) == sorted(e.name for e in good)
    assert all(r.info.status == "FINISHED" for r in landed)
    reasons = sorted(spool.reason_of(p) for p in spool.quarantined())
    assert len(reasons) == 3
    assert any("metric 'throughput_samples_per_s' is not a number: 'fast'" in r for r in reasons)
    assert any("artifact worker.log cannot be read (PermissionError" in r for r in reasons)
    assert any("the record has no run_name" in r for r in reasons)
    assert server.url not in health._DOWN
    second = run_sync(capsys)
    assert second[0] == 1 and "nothing to upload" in second[1]  # bad/ still needs a human


def test_a_failure_after_the_run_was_created_leaves_no_running_run(home, server, monkeypatch):
    """The server fails the closing call (HTTP 500): the half-logged run is deleted with its
    artifacts, the entry stays spooled, and the retry lands exactly one run."""
    from mlflow.exceptions import MlflowException

    exp = f"half-{uuid.uuid4().hex[:6]}"
    (entry,) = spooled(server.url, exp)
    real = mlflow.MlflowClient.set_terminated
    calls = []

    def flaky(self, run_id, *a, **kw):
        calls.append(run_id)
        if len(calls) == 1:
            raise MlflowException("the store hiccuped", error_code="INTERNAL_ERROR")
        return real(self, run_id, *a, **kw)
    monkeypatch.setattr(mlflow.MlflowClient, "set_terminated", flaky)
    with pytest.raises(target.TrackingUnavailable, match="HTTP 500"):
        writer.deliver(entry)
    assert [r.info.status for r in experiment_runs(server.url, exp)] == []
    assert server.url not in health._DOWN  # a 500 is not a server that is gone
    exp_id = mlflow.MlflowClient(server.url).get_experiment_by_name(exp).experiment_id
    assert not list((server.root / "artifacts" / exp_id).glob(f"{calls[0]}/artifacts/*"))
    run_id = writer.deliver(spool.find(entry.name))
    assert [r.info.run_id for r in experiment_runs(server.url, exp)] == [run_id]


# --- 3, 4: the spool's own filesystem faults ---------------------------------------------------

def test_setting_aside_on_a_full_disk_is_reported_not_a_traceback(home, server, capsys, faults):
    exp = f"full-{uuid.uuid4().hex[:6]}"
    spooled(server.url, exp)
    broken = spool.spool_dir() / "broken"
    broken.mkdir()
    (broken / spool.RECORD).write_text("{not json")
    faults.full(broken)  # no room for its reason.txt
    faults.full(spool.spool_dir() / spool.BAD)
    code, out, err = run_sync(capsys)
    assert code == 1 and "1 uploaded" in out and "1 could not be read" in out, out + err
    assert "could not set broken aside" in err and "No space left on device" in err
    assert not (broken / "reason.txt").exists() and not spool.quarantined()
    with pytest.raises(spool.SpoolError, match="No space left"):
        spool.quarantine(broken, "x")
    faults.clear()
    faults.readonly(spool.spool_dir())
    with pytest.raises(spool.SpoolError, match="Read-only file system"):
        spool.quarantine(broken, "x")


def test_a_read_only_spool_is_not_an_empty_one(home, server, capsys, faults):
    exp = f"ro-{uuid.uuid4().hex[:6]}"
    spooled(server.url, exp, n=3)
    faults.readonly(spool.spool_dir())
    code, out, err = run_sync(capsys)
    assert code == 1 and "0 uploaded, 3 still spooled" in out, out + err
    assert "3 could not be read or claimed" in out and "Read-only file system" in err
    assert experiment_runs(server.url, exp) == []


def test_an_unreadable_entry_directory_is_reported_every_time(home, server, capsys, faults):
    exp = f"locked-{uuid.uuid4().hex[:6]}"
    spooled(server.url, exp, n=2)
    (locked,) = spooled(server.url, exp)
    faults.locked(locked)
    for _ in range(2):
        code, out, err = run_sync(capsys)
        assert code == 1 and f"cannot read {locked}" in err and "Permission denied" in err
        assert "nothing to upload" not in out
    assert len(experiment_runs(server.url, exp)) == 2
    faults.clear()
    code, out, _ = run_sync(capsys)  # permissions fixed: it lands
    assert code == 0 and "1 uploaded" in out and len(experiment_runs(server.url, exp)) == 3


# --- 5: a server restart mid-sync --------------------------------------------------------------

def test_a_sync_waits_for_a_restarting_server(home, server, capsys, monkeypatch):
    exp = f"restart-{uuid.uuid4().hex[:6]}"
    spooled(server.url, exp, n=4)
    monkeypatch.setattr(sync, "WAIT_S", 120.0)
    real = writer.deliver
    delivered = []

    def restart_after_the_first(entry, uri=None, **kw):
        if len(delivered) == 1:
            server.stop()  # down for a few seconds while the sync is on its second entry
            threading.Timer(3.0, server.start).start()
        delivered.append(entry)
        return real(entry, uri, **kw)
    monkeypatch.setattr(writer, "deliver", restart_after_the_first)
    code, out, err = run_sync(capsys)
    assert code == 0 and "4 uploaded, 0 still spooled" in out, out + err
    assert "cannot reach the tracking server" in err and "HTTP 500" not in err
    assert "answers again" in err
    # the entry that met the outage was retried under the same claim, by the same process
    assert delivered[2].name == delivered[1].name + spool._claim_suffix()
    runs = experiment_runs(server.url, exp)
    assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs)
    assert len({r.data.tags["fxtrack.result_id"] for r in runs}) == 4


def test_a_refused_connection_is_unreachable_not_http_500(home):
    from mlflow.utils.rest_utils import MlflowHostCreds, http_request

    creds = MlflowHostCreds("http://127.0.0.1:9")  # nobody listens on the discard port
    with pytest.raises(mlflow.exceptions.MlflowException) as caught:
        http_request(creds, "/api/2.0/mlflow/experiments/search", "GET", max_retries=0)
    error = errors.classify(caught.value, {"uri": "http://127.0.0.1:9"})
    assert isinstance(error, errors.ServerUnreachable) and "HTTP 500" not in str(error)
    assert "ConnectionRefusedError" in str(error)


# --- 6: a full disk while spooling -------------------------------------------------------------

def test_a_full_disk_leaves_no_partial_entry_and_the_result_is_delivered_directly(
        home, server, faults, tmp_path):
    exp = f"nospace-{uuid.uuid4().hex[:6]}"
    spool.check_writable()
    faults.full(spool.spool_dir())
    with pytest.raises(spool.SpoolError):
        spool.check_writable()
    assert not list(spool.spool_dir().glob(".probe-*"))  # not even an empty probe file
    rec = dict(synthetic(server.url), experiment=exp)
    result = tmp_path / "result.json"
    result.write_text('{"status": "FINISHED"}')
    artifacts = dict(ARTIFACTS, **{"result.json": result})
    with pytest.raises(spool.SpoolError, match="No space left"):
        spool.write(rec, artifacts)
    assert not list(spool.spool_dir().iterdir())  # no <id>.tmp-<pid>/ with half the files
    run_id, where, message = writer.log_record(rec, artifacts, server.url)
    assert run_id and "not spooled" in where and "logged directly" in message
    client = mlflow.MlflowClient(server.url)
    assert client.get_run(run_id).info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(run_id)} == set(ARTIFACTS)
    # and with the server down too: nothing claims success, the message says what is lost
    dead = "http://127.0.0.1:9"
    rec = dict(synthetic(dead), experiment=exp)
    run_id, where, message = writer.log_record(rec, artifacts, dead)
    assert run_id is None and where == "LOST" and "is LOST" in message and str(result) in message


def test_log_record_reports_like_job_log(home, server):
    """The orchestrator's call: (run id, where, message) for a delivery, a server that is down
    and an entry that cannot be logged."""
    exp = f"rec-{uuid.uuid4().hex[:6]}"
    run_id, where, message = writer.log_record(dict(synthetic(server.url), experiment=exp),
                                               ARTIFACTS, server.url)
    exp_id = mlflow.MlflowClient(server.url).get_experiment_by_name(exp).experiment_id
    assert message is None and where == (f"mlflow run {run_id} at {server.url}/#/experiments/"
                                         f"{exp_id}/runs/{run_id}?workflowType=machine_learning")
    dead = "http://127.0.0.1:9"
    run_id, where, message = writer.log_record(synthetic(dead), ARTIFACTS, dead)
    assert (run_id, where) == (None, "spooled") and "deliver later with `fxtrack sync --uri" in message
    bad = dict(synthetic(server.url), experiment=exp, metrics={"loss": None})
    run_id, where, message = writer.log_record(bad, ARTIFACTS, server.url)
    assert (run_id, where) == (None, "set aside") and "metric 'loss' is not a number" in message
    assert len(spool.quarantined()) == 1


# --- 7: requests per result, replaced runs' artifacts -------------------------------------------

def test_a_result_costs_few_requests(home, server, capsys, monkeypatch):
    import collections
    import requests

    exp = f"reqs-{uuid.uuid4().hex[:6]}"
    parent = dict(synthetic(server.url, kind="sweep", status="FINISHED"), experiment=exp)
    spool.write(parent, {})
    for _ in range(5):
        spool.write(dict(synthetic(server.url, parent=parent["result_id"], params=150),
                         experiment=exp), ARTIFACTS)
    count: collections.Counter[str] = collections.Counter()
    sent = []
    real = requests.Session.request
    real_urlopen = health.urllib.request.urlopen

    def endpoint(method, url):
        if url.startswith(server.url):  # not MLflow's telemetry: it never reaches the server
            path = url[len(server.url):]
            count[f"{method} " + ("artifact" if "/mlflow-artifacts/" in path else path)] += 1
            sent.append(f"{method} {path}")

    def counted(self, method, url, *a, **kw):
        endpoint(method, url)
        return real(self, method, url, *a, **kw)

    def counted_urlopen(url, *a, **kw):
        endpoint("GET", url)
        return real_urlopen(url, *a, **kw)
    monkeypatch.setattr(requests.Session, "request", counted)
    monkeypatch.setattr(health.urllib.request, "urlopen", counted_urlopen)
    code, out, err = run_sync(capsys)
    assert code == 0 and "6 uploaded" in out, out + err
    # a child: create, search (for earlier runs of its result), 2 log_batch (150 params),
    # 4 artifacts, close = 9; the parent: search, create, search, log_batch, close = 5; the
    # probe and the experiment (looked up, created) once per sync: 53, 8.8 per result
    api = "POST /api/2.0/mlflow/"
    assert count == {"GET /health": 1, "GET /api/2.0/mlflow/experiments/get-by-name": 1,
                     api + "experiments/create": 1, api + "runs/create": 6,
                     api + "runs/search": 7, api + "runs/log-batch": 11, "PUT artifact": 20,
                     api + "runs/update": 6}, "\n".join(sent)
    runs = experiment_runs(server.url, exp)
    (p,) = [r for r in runs if r.data.tags["fxtrack.result_id"] == parent["result_id"]]
    children = [r for r in runs if r is not p]
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {p.info.run_id}
    assert all(len(r.data.params) == 150 for r in children)
    client = mlflow.MlflowClient(server.url)
    assert {a.path for a in client.list_artifacts(children[0].info.run_id)} == set(ARTIFACTS)
    history = client.get_metric_history(children[0].info.run_id, "step_time_ms")
    assert [m.step for m in history] == [0, 1, 2]


def test_a_long_sync_probes_health_once_not_per_entry(home, server, monkeypatch):
    """Each delivered run counts as an answer from the server: a sync slower than the probe's
    freshness window (a busy server, many entries) does not probe /health before each entry."""
    monkeypatch.setattr(health, "UP_FRESH_S", 3.0)
    first, second = spooled(server.url, f"probe-{uuid.uuid4().hex[:6]}", n=2)
    probes = []
    real_urlopen = health.urllib.request.urlopen

    def counted_urlopen(url, *a, **kw):
        probes.append(url)
        return real_urlopen(url, *a, **kw)
    monkeypatch.setattr(health.urllib.request, "urlopen", counted_urlopen)
    health._UP[server.url] = time.monotonic() - 2.0  # the sync's probe answered 2 s ago
    writer.deliver(first)
    time.sleep(1.5)  # that answer is stale now; the run just delivered is not
    writer.deliver(second)
    assert probes == []


def test_a_replaced_run_takes_its_artifacts_with_it(home, server):
    exp = f"repl-{uuid.uuid4().hex[:6]}"
    (entry,) = spooled(server.url, exp)
    client = mlflow.MlflowClient(server.url)
    exp_id = client.create_experiment(exp)
    leftover = client.create_run(exp_id, tags={"fxtrack.result_id": entry.name,
                                               runs.WRITER_TAG: f"{os.uname().nodename}:"
                                                                  "99999999:1"})
    client.log_text(leftover.info.run_id, "half", "worker.log")
    folder = server.root / "artifacts" / exp_id / leftover.info.run_id / "artifacts"
    assert (folder / "worker.log").is_file()
    run_id = writer.deliver(entry)
    assert client.get_run(leftover.info.run_id).info.lifecycle_stage == "deleted"
    assert not folder.exists() or not list(folder.iterdir())
    assert [r.info.run_id for r in experiment_runs(server.url, exp)] == [run_id]


# --- psutil, 11 --------------------------------------------------------------------------------

def test_pid_liveness():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert spool.alive(os.getpid()) and not spool.alive(proc.pid)


def test_environment_json_keeps_terraform_variables_and_credential_values_out(monkeypatch):
    planted = "planted-" + uuid.uuid4().hex[:12]
    token = "ghp_" + uuid.uuid4().hex + "AbC"
    monkeypatch.setenv("TF_VAR_db_pass", planted)
    monkeypatch.setenv("TF_VAR_github_pat", token)
    monkeypatch.setenv("TF_TOKEN_app_terraform_io", planted)
    monkeypatch.setenv("TF_CLI_ARGS_apply", f"-var=db_pass={planted}")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv("TF_XLA_FLAGS", f"--tf_xla_auto_jit=2 --password={planted}")
    monkeypatch.setenv("FXTRACK_NOTE", f"see {token}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-6f1c2d3e-aaaa-bbbb-cccc-1234567890ab")
    text = records.environment_json()
    env = json.loads(text)["environment"]
    assert planted not in text and token not in text
    assert not [k for k in env if k.startswith(("TF_VAR_", "TF_TOKEN_", "TF_CLI_"))]
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert env["TF_XLA_FLAGS"] == "--tf_xla_auto_jit=2 --password=***"
    assert env["FXTRACK_NOTE"] == "see ***"
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-6f1c2d3e-aaaa-bbbb-cccc-1234567890ab"
    assert environment.redact_credentials("a " + "Zq8" * 9 + " b") == "a *** b"


def test_a_dataset_insert_lost_to_a_concurrent_run_is_tried_again(server, monkeypatch):
    """Two runs logging the same dataset at once: the server's get-or-create of the dataset row
    lets both insert it, and the loser gets a unique-constraint error (seen with 8 concurrent
    syncs on SQLite). That one is tried again and links the dataset; any other refusal is not."""
    from mlflow.entities import Dataset, DatasetInput
    from mlflow.exceptions import MlflowException

    client = mlflow.MlflowClient(server.url)
    exp = client.create_experiment(f"race-{uuid.uuid4().hex[:8]}")
    run_id = client.create_run(exp).info.run_id
    datasets = [DatasetInput(Dataset(name="synthetic-vit", digest="seed0-2x3x32x32",
                                     source_type="code", source="{}"))]
    real, calls = client.log_inputs, []

    def racing(rid, datasets=None, **kw):
        calls.append(rid)
        if len(calls) == 1:
            raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: "
                                  "datasets.experiment_id, datasets.name, datasets.digest",
                                  error_code="INVALID_PARAMETER_VALUE")
        return real(rid, datasets=datasets, **kw)

    monkeypatch.setattr(client, "log_inputs", racing)
    runs.log_inputs(client, run_id, datasets)
    assert len(calls) == 2
    assert [d.dataset.name for d in client.get_run(run_id).inputs.dataset_inputs] == \
        ["synthetic-vit"]

    def refused(rid, datasets=None, **kw):
        calls.append(rid)
        raise MlflowException("dataset name too long", error_code="INVALID_PARAMETER_VALUE")

    monkeypatch.setattr(client, "log_inputs", refused)
    calls.clear()
    with pytest.raises(MlflowException, match="too long"):
        runs.log_inputs(client, run_id, datasets)
    assert len(calls) == 1
