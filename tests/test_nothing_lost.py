"""Issue 43: bad input and faults, as a skeptical operator tries them; each ends in one clear
line, with nothing lost. Real subprocesses and real signals where the fault is a process's."""

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
    proc = subprocess.run([sys.executable, "-m", "fxtrack", "size=tiny", *override.split()],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    proc = subprocess.Popen([sys.executable, "-m", "fxtrack", "ui", "--uri", uri, "--port",
                             str(port)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
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
