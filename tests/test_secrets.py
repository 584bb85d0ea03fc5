"""Issue 60: a credential never leaves the process that was given it. A password is planted in
each way a URI enters fxtrack (a preset's tracking.uri, ``tracking.uri=``, $MLFLOW_TRACKING_URI,
``report --uri`` and ``--log``, ``ui --uri``), and every file the commands wrote, every byte the
server stored and every stream they printed is searched for it. And ``fxtrack ui`` neither hangs
on a dead server nor leaves its MLflow server behind when it is SIGKILLed."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_fxtrack, seed_peak_cache
from servers import MlflowServer, free_port
from test_nothing_lost import processes_mentioning, user_env

from fxtrack import environment

# fixed, not random: parametrize ids hold it, and xdist needs them equal in every worker
PW = "s3cretPW-7f3a91c2e0d4"
TINY = ["framework=torch", "model=vit", "size=tiny", "batch_size=2", "steps=2", "warmup_steps=1",
        "hardware=cpu"]
WAYS = ("preset", "override", "env")  # how a run is given its tracking URI


def with_password(url: str) -> str:
    return url.replace("://", f"://alice:{PW}@", 1)


def leaks(root: Path, *streams: str) -> list[str]:
    """Each file under ``root`` that holds the password, and each stream that does."""
    found = [str(p) for p in sorted(root.rglob("*")) if p.is_file() and PW.encode() in p.read_bytes()]
    return found + [f"stream {i}: {s[s.find(PW) - 200:s.find(PW) + 50]!r}"
                    for i, s in enumerate(streams) if PW in s]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("secrets")


@pytest.fixture(scope="module")
def server(root):
    server = MlflowServer(root / "server", workers=1).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def runs(root, server) -> dict[str, subprocess.CompletedProcess]:
    """One tiny sweep (one job: its multirun.yaml, its .hydra/ files, its parent's report) per
    way a run is given a URI with the password, each in a directory of its own."""
    presets = root / "presets" / "experiment"  # outside every directory searched for it
    presets.mkdir(parents=True)
    (presets / "secret.yaml").write_text("# @package _global_\ntracking:\n"
                                         f"  uri: {with_password(server.url)}\n")
    given = {"preset": (["--config-dir", str(presets.parent), "-m", "experiment=secret"], {}),
             "override": (["-m", f"tracking.uri={with_password(server.url)}"], {}),
             "env": (["-m"], {"MLFLOW_TRACKING_URI": with_password(server.url)})}
    # each way's own peak cache, under the directory searched for the password
    return {way: run_fxtrack(root / way, *args, *TINY,
                             env={**seed_peak_cache(root / way / "cache"), **env}, timeout=600)
            for way, (args, env) in given.items()}


@pytest.mark.parametrize("way", WAYS)
def test_a_run_given_a_uri_password_writes_it_nowhere(root, runs, way):
    """A preset's password was in the job's .hydra/config.yaml and the sweep's multirun.yaml,
    and the sweep's report linked every run with it; and, with the URI kept whole, /health was
    asked of ``http://alice:PW@host`` (no answer): the run only spooled."""
    proc = runs[way]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[spooled]" not in proc.stderr  # delivered: the password still reached the server
    written = {p.name for p in (root / way).rglob("*")}
    assert {"multirun.yaml", "config.yaml", "overrides.yaml", "hydra.yaml"} <= written
    assert leaks(root / way, proc.stdout, proc.stderr) == []


def test_the_report_and_its_logged_copy_link_the_server_without_the_password(root, server, runs):
    """``fxtrack report --uri http://user:PW@host --log`` wrote the password into every run link
    of index.html, and the logged copy showed it to whoever reads the reports experiment."""
    proc = run_fxtrack(root / "report", "report", "--uri", with_password(server.url), "--log",
                       env=seed_peak_cache(root / "report" / "cache"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "logged the files as MLflow run" in proc.stderr
    page = (root / "report" / "fxtrack-report" / "index.html").read_text()
    assert f'href="{server.url}/#/experiments/' in page  # the links are there, and open
    assert leaks(root / "report", proc.stdout, proc.stderr) == []
    stored = server.store_bytes()  # the logged report, the sweeps' reports, every run's files
    assert b"index.html" in stored or b"fxtrack-reports" in stored
    assert PW.encode() not in stored


def test_ui_gives_up_on_a_dead_server_in_seconds_with_one_line(root, server, runs, tmp_path):
    """``fxtrack ui --uri`` a server that does not answer printed nothing for 150 s and more,
    then a traceback with the password in it."""
    port = free_port()  # nobody listens there
    started = time.monotonic()
    proc = run_fxtrack(tmp_path, "ui", "--uri", with_password(f"http://127.0.0.1:{port}"),
                       env=seed_peak_cache(tmp_path / "cache"), timeout=60)
    assert time.monotonic() - started < 20
    assert proc.returncode == 1 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"http://127.0.0.1:{port}" in proc.stderr and PW not in proc.stderr
    # a server that answers: its own UI's link, without the password
    live = run_fxtrack(tmp_path, "ui", "--uri", with_password(server.url),
                       env=seed_peak_cache(tmp_path / "cache"), timeout=120)
    assert live.returncode == 0, live.stderr
    assert live.stdout.startswith(f"{server.url}/#/experiments/")
    assert leaks(tmp_path, live.stdout, live.stderr) == []


def group_members(groups: set[int]) -> list[int]:
    """Live (not zombie) processes in any of the process groups ``groups``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
            state, _, pgrp = (entry / "stat").read_text().rpartition(")")[2].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) in groups and state != "Z":
            found.append(int(entry.name))
    return found


def test_ui_sigkilled_takes_its_mlflow_server_with_it(tmp_path):
    """``fxtrack ui`` SIGKILLed left ``mlflow ui``, uvicorn and its workers serving."""
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.MlflowClient(uri).create_experiment("fxtrack")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fxtrack", "ui", "--uri", uri, "--port",
                             str(port)], cwd=tmp_path, env=user_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    groups: set[int] = set()
    try:
        link = proc.stdout.readline()  # printed once the UI answers
        assert link.startswith(f"http://127.0.0.1:{port}/"), proc.stderr.read()
        groups = {os.getpgid(pid) for pid in processes_mentioning(str(tmp_path))} - {
            os.getpgid(proc.pid)}
        assert len(group_members(groups)) >= 3  # mlflow's CLI, uvicorn, its workers
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while group_members(groups) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert group_members(groups) == []
        with socket.socket() as s, pytest.raises(OSError):
            s.connect(("127.0.0.1", port))
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=30)
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)


def test_hydra_shows_a_presets_uri_without_its_password(tmp_path):
    """``--cfg job`` printed the composed config, a preset's password included, before any
    fxtrack code ran."""
    presets = tmp_path / "presets" / "experiment"
    presets.mkdir(parents=True)
    (presets / "secret.yaml").write_text("# @package _global_\ntracking:\n"
                                         f"  uri: {with_password('http://127.0.0.1:9')}\n")
    proc = run_fxtrack(tmp_path / "run", "--config-dir", str(presets.parent), "experiment=secret",
                       "--cfg", "job", env=seed_peak_cache(tmp_path / "run" / "cache"),
                       timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "uri: http://127.0.0.1:9" in proc.stdout
    assert leaks(tmp_path / "run", proc.stdout, proc.stderr) == []


@pytest.mark.parametrize("given, shown", [
    (f"http://u:{PW}@h:1/x", "http://h:1/x"),
    (f"http://u:p@{PW}@h:1/x", "http://h:1/x"),  # a raw '@' in the password: not its tail
    (f"http://u:{PW}@[::1]:5000/", "http://[::1]:5000/"),  # IPv6: brackets and port kept
    (f"postgresql+psycopg2://u:{PW}@DB:5432/reg", "postgresql+psycopg2://DB:5432/reg"),
    (f'<a href="https://u:{PW}@h/#/e">x</a> mail a@b.c', '<a href="https://h/#/e">x</a> mail a@b.c'),
    (f"tracking.uri=http://h:1,http://u:{PW}@h:2", "tracking.uri=http://h:1,http://h:2"),
])
def test_one_redaction_for_a_uri_and_for_text(given, shown):
    assert environment.redact_uri_text(given) == shown
    assert environment.redact_uri_text(given) == shown  # the same rule by its older name


def test_every_link_drops_credentials():
    from fxtrack.report import page
    from fxtrack.tracking.ui import experiment_link, run_link

    base = f"http://u:{PW}@h:5000/"
    assert run_link(base, "1", "abc") == "http://h:5000/#/experiments/1/runs/abc?workflowType=machine_learning"
    assert experiment_link(base, "1") == "http://h:5000/#/experiments/1?workflowType=machine_learning"
    assert page.ui_base(base) == page.ui_base("sqlite:///x", base) == "http://h:5000"


def test_tracebacks_and_log_lines_carry_no_uri_password(tmp_path):
    """What no fxtrack line redacts itself (a library's exception, a log record, a log file)."""
    script = (
        "import logging\n"
        "from fxtrack.environment import redact_process_output\n"
        "redact_process_output()\n"
        f"logging.basicConfig(filename={str(tmp_path / 'job.log')!r})\n"
        "logging.getLogger().addHandler(logging.StreamHandler())\n"
        f"logging.warning('store %s', 'postgresql://u:{PW}@db/x')\n"
        "try:\n"
        f"    raise OSError('no answer from http://u:{PW}@h:1')\n"
        "except OSError:\n"
        "    logging.exception('failed')\n"
        f"print('at http://u:{PW}@h:1')\n"
        f"raise RuntimeError('http://u:{PW}@h:1/api')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1 and "RuntimeError: http://h:1/api" in proc.stderr
    assert "at http://h:1" in proc.stdout and "store postgresql://db/x" in proc.stderr
    assert "OSError: no answer from http://h:1" in (tmp_path / "job.log").read_text()
    assert leaks(tmp_path, proc.stdout, proc.stderr) == []
