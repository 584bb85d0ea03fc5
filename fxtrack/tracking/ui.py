"""``fxtrack ui``: the MLflow UI on the store fxtrack used, and the link to its experiment.

The store is the one a run from this directory would log to (``--uri``, else
``$MLFLOW_TRACKING_URI``, else the embedded ``sqlite:///<here>/mlflow.db``). A tracking server
already serves its own UI: then only the link is printed. The link carries
``workflowType=machine_learning``: without it the MLflow UI opens the experiment in its GenAI
layout (a switch kept in the browser), not the Runs table.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional

PROG = "fxtrack ui"
WORKFLOW = "workflowType=machine_learning"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--uri", help="tracking URI (default: $MLFLOW_TRACKING_URI, else "
                        "sqlite:///<current directory>/mlflow.db)")
    parser.add_argument("--experiment", default="fxtrack", help="default: %(default)s")
    parser.add_argument("--host", default="127.0.0.1", help="default: %(default)s")
    parser.add_argument("--port", type=int, default=5000, help="default: %(default)s")
    return parser.parse_args(argv)


def experiment_link(base: str, experiment_id: str) -> str:
    """The experiment's Runs table in the MLflow UI at ``base`` (every link fxtrack writes)."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}?{WORKFLOW}"


def run_link(base: str, experiment_id: str, run_id: str) -> str:
    """A run's page in the MLflow UI at ``base``."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW}"


def next_steps(uri: str, run_id: Optional[str], what: str = "the run",
               experiment: str = "fxtrack") -> str:
    """A run's (or a sweep's) last lines: where its results are and what to open next. On a
    server, ``what``'s page in its UI; on a local store, ``fxtrack ui``, which serves it."""
    from fxtrack.environment import redact_uri

    lines = [f"[fxtrack] results in {redact_uri(uri)}",
             "[fxtrack] next: fxtrack report    (the answer, tables and charts: "
             "./fxtrack-report/index.html)"]
    if uri.startswith(("http://", "https://")) and run_id:
        from fxtrack.tracking import runs

        exp_id = runs.known_experiment(uri, experiment)
        if exp_id is not None:
            lines.append(f"[fxtrack]       {what} in the MLflow UI: "
                         f"{run_link(redact_uri(uri), exp_id, run_id)}")
            return "\n".join(lines)
    lines.append(f"[fxtrack]       fxtrack ui        (the MLflow UI on this store; {what}: "
                 f"{run_id or 'in the local spool until fxtrack sync'})")
    return "\n".join(lines)


def ui_env() -> dict[str, str]:
    """The environment ``mlflow ui`` runs in: the store comes from --backend-store-uri, not a
    tracking URI; MLflow 3's job runner (GenAI scorers: four huey consumers, ~1 GiB) is off
    unless set, as fxtrack's runs use no jobs."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    return env


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from fxtrack.environment import redact_uri
    from fxtrack.tracking.target import tracking_uri

    uri = tracking_uri(args.uri, os.getcwd())
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        print(f"{PROG}: no store at {uri}: run fxtrack here first, or pass --uri", file=sys.stderr)
        return 1
    import mlflow

    exp = mlflow.MlflowClient(uri).get_experiment_by_name(args.experiment)
    if exp is None:
        print(f"{PROG}: {redact_uri(uri)} has no experiment {args.experiment!r}", file=sys.stderr)
        return 1
    if uri.startswith(("http://", "https://")):  # a server: its own UI
        print(experiment_link(redact_uri(uri), exp.experiment_id), flush=True)
        return 0
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    command = [str(mlflow_cli) if mlflow_cli.is_file() else "mlflow", "ui", "--backend-store-uri",
               uri, "--host", args.host, "--port", str(args.port)]
    # its own process group: mlflow ui starts workers of its own, and stopping the UI stops
    # them all (a SIGTERM to mlflow's CLI alone left them listening, issue 43)
    ui = subprocess.Popen(command, env=ui_env(), stdout=sys.stderr,  # stdout: the link alone
                          start_new_session=True)
    base = f"http://{args.host}:{args.port}"
    try:
        if not wait_until_up(base, ui, 300):  # a loaded machine starts mlflow ui slowly
            print(f"{PROG}: mlflow ui did not start on {base}", file=sys.stderr)
            return 1
        print(f"{PROG}: experiment {args.experiment!r} of {redact_uri(uri)} (Ctrl-C stops the UI):",
              file=sys.stderr)
        print(experiment_link(base, exp.experiment_id), flush=True)
        return ui.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop_group(ui)


def stop_group(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGTERM to ``proc``'s process group, then SIGKILL to what is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the whole group is gone
            break
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        deadline = time.monotonic() + grace_s  # the leader is gone; its workers may linger
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def wait_until_up(base: str, server: subprocess.Popen, timeout_s: float) -> bool:
    """Poll ``base``/health until it answers (True), or the server exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{base}/health", timeout=2)
            return True
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.5)
