"""Run one JobSpec in a ``python -m fxtrack.worker`` subprocess, contained: a crash, a signal or
a timeout becomes a FAILED Result carrying the error, and the log survives in ``worker.log``.

The worker runs in a session of its own (a Ctrl-C at the terminal does not reach it directly):
SIGINT/SIGTERM of the orchestrator are forwarded to the worker's process group, the Result
comes back KILLED with what was measured, and ``interrupted()`` names the signal so the caller
can log the run, close the sweep and exit 128+signal. The worker's environment carries no
secret-named variable and no URI credentials: it never talks to MLflow."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import fxtrack
from fxtrack.environment import parent_death_signal, redact_text, worker_environment
from fxtrack.worker.protocol import JobSpec, Result, children_path, streamed_children
from fxtrack.worker.protocol import GATE_ENV, PARENT_ENV

_PACKAGE_ROOT = str(Path(fxtrack.__file__).resolve().parent.parent)
LOG_TAIL_BYTES = 64 * 1024
_INTERRUPTED: list[int] = []  # the signal that stopped this orchestrator, if any


def interrupted() -> int | None:
    """The signal number (SIGINT / SIGTERM) this orchestrator received, or None."""
    return _INTERRUPTED[0] if _INTERRUPTED else None


def run_worker(spec: JobSpec, job_dir: Path, python: str | None, timeout_s: float,
               echo: bool = True, meanwhile: Callable[[], None] | None = None,
               while_running: Callable[[], None] | None = None) -> Result:
    """Run the worker for ``spec`` under ``python`` (default: this interpreter), tee its output
    to ``job_dir/worker.log`` (and the terminal when ``echo``), and return its Result.

    ``meanwhile``: work of this process (loading MLflow) done while the worker starts, i.e.
    imports its framework and builds the model; the worker waits at its gate (the scenario
    calls worker.protocol.pass_gate once it has built) until it is done, so that work never
    shares the cores with a warm-up or timed window. Under torchrun (no way to hand the gate to its ranks) it
    is done before the worker starts.

    ``while_running``: called about every half second while the worker runs, and once after
    it ends (keeping each streamed child the moment it appears)."""
    spec_path, log_path = job_dir / "spec.json", job_dir / "worker.log"
    spec.dump(spec_path)
    Path(spec.result_path).unlink(missing_ok=True)
    children_path(spec.result_path).unlink(missing_ok=True)
    env = worker_environment(os.environ)
    # The worker imports fxtrack from this checkout even under another venv's interpreter.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env[PARENT_ENV] = str(os.getpid())  # the worker stops when this process is gone
    cmd = worker_command(spec, python or sys.executable, spec_path)
    gate_read = gate = None
    if meanwhile is not None and cmd[1:3] == ["-m", "fxtrack.worker"]:
        gate_read, gate = os.pipe()
        env[GATE_ENV] = str(gate_read)
    elif meanwhile is not None:
        meanwhile()
        meanwhile = None
    # Handlers go in before the worker starts: a signal in between must not be lost.
    with open(log_path, "wb") as log, _forwarding() as forward:
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                    pass_fds=() if gate_read is None else (gate_read,),
                                    preexec_fn=_parent_death_signal(cmd))
        except OSError as e:
            msg = f"cannot start the worker with framework.python={cmd[0]}: {e.strerror or e}"
            log.write(f"[fxtrack] {msg}\n".encode())
            _close_gate(gate, go=False)
            return Result(spec.result_id, error=msg)
        finally:
            if gate_read is not None:
                os.close(gate_read)  # the worker holds its own copy
                gate_read = None
        forward.proc = proc
        if _INTERRUPTED:  # arrived while the worker was starting
            _kill_group(proc, signal.SIGTERM)
        tee = threading.Thread(target=_tee, args=(proc.stdout, log, echo, not spec.verbose),
                               daemon=True)
        tee.start()
        go = False
        try:
            if meanwhile is not None:
                meanwhile()
            go = True
        finally:  # an exception here closes the gate unopened: the worker stops, unrun
            _close_gate(gate, go)
            if not go:
                _stop(proc, None)
        timed_out = _wait(proc, timeout_s, while_running)
        # what the worker left in its group (it exits without tearing down: worker.leave)
        # would hold its output pipe open: the tee would wait on it
        _kill_group(proc, signal.SIGKILL)
        tee.join(timeout=10)
        if while_running is not None:  # what the worker wrote in its last half second
            while_running()
    return _outcome(spec, proc.returncode, timed_out, timeout_s, log_path)


def _parent_death_signal(cmd: list[str]) -> Callable[[], None] | None:
    """torchrun is not fxtrack's code and watches no parent: the kernel sends it SIGTERM (which
    it passes on to its ranks) when this process dies. fxtrack's own worker watches its parent
    itself (worker.__main__.die_with_parent)."""
    return parent_death_signal(signal.SIGTERM) if TORCHRUN[-1] in cmd else None


def _close_gate(write_fd: int | None, go: bool) -> None:
    """Tell the waiting worker to go on (one byte) or stop (none), and close the pipe."""
    if write_fd is None:
        return
    try:
        if go:
            os.write(write_fd, b"1")
    except OSError:  # the worker ended before its gate (refused, crashed): nothing to tell
        pass
    finally:
        os.close(write_fd)


class _forwarding:
    """While the worker runs, SIGINT/SIGTERM stop its process group (SIGTERM, then SIGKILL
    after a grace period) instead of killing this process with a traceback."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.saved: dict = {}

    def _handle(self, signum, frame) -> None:
        if not _INTERRUPTED:
            _INTERRUPTED.append(signum)
        if self.proc is not None:
            _kill_group(self.proc, signal.SIGTERM)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


# torchrun, its rendezvous store on 127.0.0.1 when every rank is on this machine (torch's own
# listens on every interface: fxtrack.frameworks.torch.launch)
TORCHRUN = ("-m", "fxtrack.frameworks.torch.launch")


def worker_command(spec: JobSpec, python: str, spec_path: Path) -> list[str]:
    """``python -m fxtrack.worker SPEC``, or under torchrun one worker per device (and node)."""
    worker = ["-m", "fxtrack.worker", str(spec_path)]
    if spec.launcher != "torchrun" or (spec.devices == 1 and spec.nodes == 1):
        return [python, *worker]
    if spec.nodes > 1:
        host, _, port = spec.coordinator.rpartition(":")
        where = [f"--nnodes={spec.nodes}", f"--node-rank={spec.node_rank}",
                 f"--master-addr={host}", f"--master-port={port}"]
    else:
        where = ["--standalone"]
    return [python, *TORCHRUN, f"--nproc-per-node={spec.devices}", *where, *worker]


# Start-up chatter frameworks print whatever their log level (TensorFlow's oneDNN notice and absl
# preamble, XLA's plugin registration). Kept in worker.log, not shown unless verbose=true.
NOISE = re.compile(rb"^(WARNING: All log messages before absl::InitializeLog|I0000 |W0000 |E0000 "
                   rb"|.*oneDNN custom operations are on|.*Unable to register cu(DNN|FFT|BLAS) "
                   rb"factory|.*computation placer already registered|.*TF-TRT Warning"
                   rb"|.*This TensorFlow binary is optimized)")


_TB_START = (b"Traceback (most recent call last)", b"During handling of the above exception",
             b"The above exception was the direct cause")


def _tee(stream, log, echo: bool, quiet: bool = True) -> None:
    """Copy the worker's output to the log, and to the terminal without known noise lines; when
    ``quiet`` a Python traceback stays in the log (the run's error line says what failed)."""
    in_tb = pointed = False
    # a read may end mid-line: the rest of that line is shown or hidden with its start, never
    # taken for a new line (a split traceback line then showed the rest of the traceback)
    mid_line = hidden = False
    for chunk in iter(lambda: stream.read1(4096), b""):
        log.write(chunk)
        log.flush()
        if echo and not _INTERRUPTED:
            if quiet:
                shown = []
                for ln in chunk.splitlines(keepends=True):
                    continued, mid_line = mid_line, not ln.endswith((b"\n", b"\r"))
                    if continued:
                        if not hidden:
                            shown.append(ln)
                        continue
                    hidden = True
                    if ln.startswith(_TB_START):
                        if not pointed:
                            pointed = True
                            shown.append(b"[fxtrack] worker traceback kept in worker.log "
                                         b"(verbose=true shows it)\n")
                        in_tb = True
                    elif in_tb and not (ln[:1].isspace() or not ln.strip()):
                        in_tb = False  # the exception's own line ends the block
                        continue
                    if not in_tb and not NOISE.match(ln):
                        shown.append(ln)
                        hidden = False
                chunk = b"".join(shown)
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()


def _wait(proc: subprocess.Popen, timeout_s: float,
          while_running: Callable[[], None] | None = None) -> bool:
    """Wait for the worker; past ``timeout_s`` stop its whole process group. True if timed out.
    After a forwarded signal, the worker gets 10 s to stop before SIGKILL."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and not _INTERRUPTED:
        if while_running is not None:
            while_running()
        left = deadline - time.monotonic()
        if left <= 0:
            _stop(proc, signal.SIGTERM)
            return True
        try:  # short waits: a signal handler runs between them
            proc.wait(timeout=min(0.5, left))
        except subprocess.TimeoutExpired:
            pass
    if _INTERRUPTED:
        _stop(proc, None)
    return False


def _stop(proc: subprocess.Popen, sig: int | None) -> None:
    """Send ``sig`` (if any) to the worker's group, give it 10 s, then SIGKILL the group."""
    if sig is not None:
        _kill_group(proc, sig)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _kill_group(proc, signal.SIGKILL)
        proc.wait()


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _outcome(spec: JobSpec, code: int, timed_out: bool, timeout_s: float, log: Path) -> Result:
    result_path = Path(spec.result_path)
    result = Result.read(result_path) if result_path.exists() else Result(spec.result_id)
    if not result.children:  # a worker stopped mid-search: the windows that had ended
        result.children = streamed_children(result_path)
    if spec.node_rank != 0 and code == 0 and not timed_out:
        result.status = "FINISHED"  # a non-zero node writes no Result: node 0 reports for all
    if _INTERRUPTED:
        name = signal.Signals(_INTERRUPTED[0]).name
        result.status, result.error = "KILLED", f"interrupted by {name}: the worker was stopped"
    elif timed_out:
        result.status, result.error = "FAILED", f"timed out after timeout_s={timeout_s:g} s"
    elif code < 0:
        name = signal.Signals(-code).name
        hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if name == "SIGKILL" else ""
        result.status, result.error = "FAILED", f"worker killed by {name}{hint}"
    elif code != 0 and not result.error:
        result.status, result.error = "FAILED", f"worker exited with status {code}: {_last_line(log)}"
    return result


def _last_line(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def log_tail(log: Path) -> str:
    """The end of the worker's log, for the worker.log artifact: secret values of this
    process's environment and URI credentials masked (a wrapper may print its environment)."""
    if not log.exists():
        return ""
    data = log.read_bytes()
    return redact_text(data[-LOG_TAIL_BYTES:].decode(errors="replace"))
