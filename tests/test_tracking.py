"""Against real ``mlflow server`` processes: basic-auth, 401/403 messages, secrets kept out of the
store, the spool and ``fxtrack sync`` (exactly once, sweep links kept), concurrent writers, the
run-context plugin, and failure containment."""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("torch")

from servers import ADMIN, MlflowServer, free_port  # noqa: E402
from conftest import run_fxtrack  # noqa: E402

TINY = ["framework=torch", "model=vit", "size=tiny", "batch_size=2", "steps=2",
        "warmup_steps=1", "framework.compile=false"]
PLANTED = "planted-secret-" + uuid.uuid4().hex[:12]


def admin_client(server: MlflowServer):
    os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = ADMIN
    return mlflow.MlflowClient(server.url)


def runs_in(client, experiment: str = "fxtrack"):
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp else []


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("auth-server"), auth=True).start()
    yield server
    server.stop()
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        os.environ.pop(key, None)


def _create_user(server: MlflowServer, name: str, password: str) -> None:
    request = urllib.request.Request(
        f"{server.url}/api/2.0/mlflow/users/create", method="POST",
        data=json.dumps({"username": name, "password": password}).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Basic " +
                 base64.b64encode(f"{ADMIN[0]}:{ADMIN[1]}".encode()).decode()})
    urllib.request.urlopen(request, timeout=30).read()


def test_team_server_with_basic_auth_and_no_secret_reaches_the_store(tmp_path, auth_server):
    env = {"MLFLOW_TRACKING_URI": auth_server.url, "MLFLOW_TRACKING_USERNAME": ADMIN[0],
           "MLFLOW_TRACKING_PASSWORD": ADMIN[1], "MY_SERVICE_API_TOKEN": PLANTED,
           "DB_PASSWORD": PLANTED}
    proc = run_fxtrack(tmp_path, *TINY,
                       f"tracking.uri=http://{ADMIN[0]}:{ADMIN[1]}@127.0.0.1:{auth_server.port}",
                       env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (run,) = [r for r in runs_in(admin_client(auth_server)) if r.data.tags.get("fxtrack.framework")]
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "torch-vit-train-fp32-x1-tiny-b2-s2-compile_false"
    assert run.data.params["tracking.uri"] == f"http://127.0.0.1:{auth_server.port}"
    store = auth_server.store_bytes()
    assert b"environment.json" in store or (auth_server.root / "artifacts").exists()
    for secret in (PLANTED, ADMIN[1]):
        assert secret.encode() not in store, secret
    assert PLANTED not in proc.stderr and ADMIN[1] not in proc.stderr


def test_bad_credentials_stop_the_run_before_any_work(tmp_path, auth_server):
    """A 401 is permanent: found by the pre-flight check, said once, nothing run or spooled."""
    env = {"MLFLOW_TRACKING_URI": auth_server.url, "MLFLOW_TRACKING_USERNAME": ADMIN[0],
           "MLFLOW_TRACKING_PASSWORD": "wrong-password"}
    proc = run_fxtrack(tmp_path, *TINY, env=env, timeout=600)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "rejected the credentials (HTTP 401)" in proc.stderr
    assert "MLFLOW_TRACKING_PASSWORD" in proc.stderr  # what to fix
    assert not list((tmp_path / "home" / "spool").iterdir())


def test_no_permission_on_the_experiment_says_so(tmp_path, auth_server):
    admin_client(auth_server).create_experiment("locked")
    _create_user(auth_server, "alice", "alice-pass-3301")
    env = {"MLFLOW_TRACKING_URI": auth_server.url, "MLFLOW_TRACKING_USERNAME": "alice",
           "MLFLOW_TRACKING_PASSWORD": "alice-pass-3301"}
    proc = run_fxtrack(tmp_path, *TINY, "tracking.experiment=locked", env=env, timeout=600)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "refused access (HTTP 403)" in proc.stderr and "'locked'" in proc.stderr
    assert "could not log" not in proc.stderr  # permanent: not reported as "server down"


def test_server_down_then_sync_twice_lands_each_run_exactly_once(tmp_path):
    port = free_port()
    env = {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"}
    proc = run_fxtrack(tmp_path, "-m", *TINY, "seed=0,1", env=env, timeout=600)
    assert proc.returncode == 1, proc.stderr  # the jobs finished, but only into the spool
    assert "3 of 3 runs (the sweep's parent included) are only in the local spool" in proc.stderr
    spooled = list((tmp_path / "home" / "spool").iterdir())
    assert len(spooled) == 3  # the sweep's parent and its two children

    started = time.monotonic()
    down = run_fxtrack(tmp_path, "sync", env=env, timeout=300)
    assert down.returncode == 1 and "3 still spooled" in down.stdout
    assert time.monotonic() - started < 120  # bounded retries, not MLflow's minutes of back-off

    server = MlflowServer(tmp_path / "server", port=port).start()
    try:
        first = run_fxtrack(tmp_path, "sync", env=env, timeout=600)
        assert first.returncode == 0, first.stderr
        assert "3 uploaded, 0 still spooled" in first.stdout
        second = run_fxtrack(tmp_path, "sync", env=env, timeout=600)
        assert second.returncode == 0 and "nothing to upload" in second.stdout
        runs = runs_in(mlflow.MlflowClient(server.url))
        assert len(runs) == 3
        assert len({r.data.tags["fxtrack.result_id"] for r in runs}) == 3
        parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
        children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
        assert len(parent) == 1 and len(children) == 2
        assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent[0].info.run_id}
        assert all(r.info.status == "FINISHED" for r in runs)
        client = mlflow.MlflowClient(server.url)
        assert {a.path for a in client.list_artifacts(children[0].info.run_id)} == {
            "config.yaml", "result.json", "environment.json", "worker.log"}
    finally:
        server.stop()


def test_eight_processes_logging_at_once_all_land(tmp_path):
    """One real result, spooled eight times under new ids, uploaded by eight concurrent
    ``fxtrack sync`` processes, each with its own spool."""
    dead = f"http://127.0.0.1:{free_port()}"
    # spooled: no server there
    run_fxtrack(tmp_path, *TINY, env={"MLFLOW_TRACKING_URI": dead}, timeout=600)
    (entry,) = (tmp_path / "home" / "spool").iterdir()
    server = MlflowServer(tmp_path / "server").start()
    try:
        homes = []
        for i in range(8):
            home = tmp_path / f"home{i}"
            rid = uuid.uuid4().hex
            copy = home / "spool" / rid
            shutil.copytree(entry, copy)
            record = json.loads((copy / "record.json").read_text())
            record.update(result_id=rid, uri=server.url)
            (copy / "record.json").write_text(json.dumps(record))
            homes.append(home)

        def sync(home: Path):
            return run_fxtrack(tmp_path, "sync", env={"FXTRACK_HOME": str(home)}, timeout=600)

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(sync, homes))
        assert all(r.returncode == 0 for r in results), [r.stderr[-500:] for r in results]
        client = mlflow.MlflowClient(server.url)
        runs = runs_in(client)
        assert len(runs) == 8 and all(r.info.status == "FINISHED" for r in runs)
        for run in runs:
            assert "throughput_samples_per_s" in run.data.metrics
            assert len(client.list_artifacts(run.info.run_id)) == 4
    finally:
        server.stop()


def test_run_context_plugin_tags_every_fluent_run(tmp_path):
    code = (
        "import sys, mlflow\n"
        f"mlflow.set_tracking_uri('sqlite:///{tmp_path / 'ctx.db'}')\n"
        "with mlflow.start_run() as run:\n    pass\n"
        "tags = mlflow.get_run(run.info.run_id).data.tags\n"
        "assert tags['fxtrack.version'] and tags['fxtrack.python'] and tags['fxtrack.host'], tags\n"
        "heavy = {'torch', 'tensorflow', 'jax', 'pynvml'} & set(sys.modules)\n"
        "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_failures_become_failed_runs_and_the_sweep_goes_on(tmp_path):
    killer = _script(tmp_path / "killed-python", "kill -KILL $$")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    bare = str(tmp_path / "bare" / "bin" / "python")
    proc = run_fxtrack(tmp_path, "-m", *TINY, f"framework.python=null,{killer},{bare}",
                       "hardware=cpu,gpu", timeout=600)
    assert proc.returncode == 1
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    children = [r for r in runs_in(client) if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 6
    errors = {(r.data.params["framework.python"], r.data.params["hardware.name"]):
              (r.info.status, r.data.tags.get("fxtrack.error", "")) for r in children}
    here = sys.executable  # framework.python=null is logged as the interpreter that ran
    assert errors[(here, "cpu")] == ("FINISHED", "")
    assert errors[(here, "gpu")][0] == "FAILED"
    assert "hardware=gpu, but PyTorch sees no CUDA device" in errors[(here, "gpu")][1]
    assert errors[(killer, "cpu")] == ("FAILED", "worker killed by SIGKILL (out of memory? "
                                       "the kernel's OOM killer sends SIGKILL)")
    status, error = errors[(bare, "cpu")]
    assert status == "FAILED" and "pip install 'fxtrack[torch]'" in error
    for run in children:
        assert "worker.log" in {a.path for a in client.list_artifacts(run.info.run_id)}
