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
    """The experiment's Runs table in the MLflow UI at ``base`` (every link fxtrack writes),
    without the credentials ``base`` may carry: a link is read by whoever reads the page."""
    from fxtrack.environment import redact_uri_text

    return f"{redact_uri_text(base).rstrip('/')}/#/experiments/{experiment_id}?{WORKFLOW}"


def run_link(base: str, experiment_id: str, run_id: str) -> str:
    """A run's page in the MLflow UI at ``base``, without credentials as experiment_link."""
    from fxtrack.environment import redact_uri_text

    return f"{redact_uri_text(base).rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW}"


def shell_command() -> str:
    """``fxtrack`` as the user's shell runs it, shell-quoted: a bare ``fxtrack`` only where the
    one on PATH is the script beside the interpreter that ran; else that script by its path (the
    README's venv is not on PATH: a bare ``fxtrack`` is "command not found"); else
    ``<interpreter> -m fxtrack`` (no script there: an install without console scripts)."""
    import shlex
    import shutil

    script = Path(sys.executable).with_name("fxtrack")
    if not (script.is_file() and os.access(script, os.X_OK)):
        return f"{shlex.quote(sys.executable)} -m fxtrack"
    on_path = shutil.which("fxtrack")
    if on_path is not None and os.path.samefile(on_path, script):
        return "fxtrack"
    return shlex.quote(str(script))


def next_steps(uri: str, run_id: Optional[str], what: str = "the run",
               experiment: str = "fxtrack") -> str:
    """A run's (or a sweep's) last lines: where its results are and what to open next. On a
    server, ``what``'s page in its UI; on a local store, ``fxtrack ui``, which serves it."""
    from fxtrack.environment import redact_uri_text

    fxtrack = shell_command()
    lines = [f"[fxtrack] results in {redact_uri_text(uri)}",
             f"[fxtrack] next: {fxtrack} report    (the answer, tables and charts: "
             "./fxtrack-report/index.html)"]
    if uri.startswith(("http://", "https://")) and run_id:
        from fxtrack.tracking import runs

        exp_id = runs.known_experiment(uri, experiment)
        if exp_id is not None:
            lines.append(f"[fxtrack]       {what} in the MLflow UI: "
                         f"{run_link(redact_uri_text(uri), exp_id, run_id)}")
            return "\n".join(lines)
    lines.append(f"[fxtrack]       {fxtrack} ui        (the MLflow UI on this store; {what}: "
                 f"{run_id or 'in the local spool until fxtrack sync'})")
    return "\n".join(lines)


# What `mlflow ui` is not given: the store comes from --backend-store-uri, not a tracking URI,
# and a server it does not talk to needs none of the tracking server's credentials.
_NOT_FOR_UI = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
               "MLFLOW_TRACKING_TOKEN")


def ui_env() -> dict[str, str]:
    """The environment ``mlflow ui`` runs in: this one without _NOT_FOR_UI; MLflow 3's job
    runner (GenAI scorers: four huey consumers, ~1 GiB) is off unless set, as fxtrack's runs
    use no jobs."""
    env = {k: v for k, v in os.environ.items() if k not in _NOT_FOR_UI}
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    return env


def find_experiment(uri: str, name: str):
    """``name``'s experiment in ``uri``'s store (None: there is none). Raises
    TrackingUnavailable with one line, without credentials, when the store cannot say; an HTTP
    server that does not answer is given up in seconds (one /health probe), not after MLflow's
    minutes of retries (issue 60)."""
    from fxtrack.environment import redact_uri_text
    from fxtrack.tracking import errors, health

    health.mlflow_defaults()
    health.probe(uri)
    import mlflow

    try:
        return mlflow.MlflowClient(uri).get_experiment_by_name(name)
    except Exception as e:  # noqa: BLE001 - any failure of the store: one line, not a traceback
        raise errors.classify(e, {"uri": redact_uri_text(uri), "experiment": name}) from None


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from fxtrack.environment import parent_death_signal, redact_uri_text
    from fxtrack.tracking.target import TrackingUnavailable, tracking_uri

    uri = tracking_uri(args.uri, os.getcwd())
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        print(f"{PROG}: no store at {redact_uri_text(uri)}: run fxtrack here first, or pass --uri",
              file=sys.stderr)
        return 1
    try:
        exp = find_experiment(uri, args.experiment)
    except TrackingUnavailable as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    if exp is None:
        print(f"{PROG}: {redact_uri_text(uri)} has no experiment {args.experiment!r}", file=sys.stderr)
        return 1
    if uri.startswith(("http://", "https://")):  # a server: its own UI
        print(experiment_link(redact_uri_text(uri), exp.experiment_id), flush=True)
        return 0
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    env = ui_env()
    store = ["--backend-store-uri", uri]
    if redact_uri_text(uri) != uri:  # a database's password: not on a command line any user's ps shows
        env["MLFLOW_BACKEND_STORE_URI"], store = uri, []
    command = [str(mlflow_cli) if mlflow_cli.is_file() else "mlflow", "ui", *store,
               "--host", args.host, "--port", str(args.port)]
    # mlflow ui under guard() (below), in a process group of its own: its uvicorn and workers
    # are its grandchildren, and stopping the group stops them all (a SIGTERM to mlflow's CLI
    # alone left them listening, issue 43). The kernel tells the guard when this process dies,
    # even by SIGKILL, which no handler here can see (issue 60).
    ui = subprocess.Popen([sys.executable, "-m", GUARD, str(os.getpid()), *command], env=env,
                          stdout=sys.stderr,  # stdout: the link alone
                          start_new_session=True, preexec_fn=parent_death_signal(signal.SIGTERM))
    base = f"http://{args.host}:{args.port}"
    try:
        if not wait_until_up(base, ui, 300):  # a loaded machine starts mlflow ui slowly
            print(f"{PROG}: mlflow ui did not start on {base}", file=sys.stderr)
            return 1
        print(f"{PROG}: experiment {args.experiment!r} of {redact_uri_text(uri)} (Ctrl-C stops the UI):",
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


GUARD = "fxtrack.tracking.ui"  # python -m GUARD PARENT_PID COMMAND...: guard()
GUARD_GRACE_S = 10.0  # what of the group outlives a SIGTERM by this long is SIGKILLed


def guard(argv: list[str]) -> int:
    """Run COMMAND (``mlflow ui``) and stop it with everything it started, its grandchildren
    included, when told to stop: a SIGTERM from stop_group, or from the kernel when PARENT_PID
    (``fxtrack ui``, which set this process's parent-death signal) dies however it dies. This
    process leads the group ``fxtrack ui`` started, and adopts (as a child subreaper) what
    mlflow's CLI leaves behind, so it knows when the last of them is gone. Returns COMMAND's
    exit status; exits only once nothing it started is left."""
    parent, command = int(argv[0]), argv[1:]
    stopping: list[float] = []

    def stop(signum: int, frame: object) -> None:
        if not stopping:  # the group's SIGTERM below reaches this process too
            stopping.append(time.monotonic())
            os.killpg(0, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    if os.getppid() != parent:  # fxtrack ui died before its death signal was set
        return 1
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_CHILD_SUBREAPER = 36
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    mlflow_ui = subprocess.Popen(command)
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)  # mlflow's CLI, or what it left behind
        except ChildProcessError:  # nothing of the UI is left
            return 1 if mlflow_ui.returncode is None else mlflow_ui.returncode
        if pid == mlflow_ui.pid:
            mlflow_ui.returncode = os.waitstatus_to_exitcode(status)
            stop(signal.SIGTERM, None)  # mlflow's CLI ended (on its own: a port in use): its
            # workers end with it
        if pid == 0:
            if stopping and time.monotonic() - stopping[0] > GUARD_GRACE_S:
                os.killpg(0, signal.SIGKILL)  # this process too: the rest could not outlive it
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


if __name__ == "__main__":  # the guard of fxtrack ui's mlflow ui (GUARD)
    sys.exit(guard(sys.argv[1:]))
