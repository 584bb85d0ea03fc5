"""Run one JobSpec in a ``python -m fxtrack.worker`` subprocess, contained: a crash, a signal or
a timeout becomes a FAILED Result carrying the error, and the log survives in ``worker.log``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import fxtrack
from fxtrack.job import JobSpec, Result

_PACKAGE_ROOT = str(Path(fxtrack.__file__).resolve().parent.parent)
LOG_TAIL_BYTES = 64 * 1024


def run_worker(spec: JobSpec, job_dir: Path, python: str | None, timeout_s: float,
               echo: bool = True) -> Result:
    """Run the worker for ``spec`` under ``python`` (default: this interpreter), tee its output
    to ``job_dir/worker.log`` (and the terminal when ``echo``), and return its Result."""
    spec_path, log_path = job_dir / "spec.json", job_dir / "worker.log"
    spec.dump(spec_path)
    Path(spec.result_path).unlink(missing_ok=True)
    env = dict(os.environ)
    # The worker imports fxtrack from this checkout even under another venv's interpreter.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    cmd = worker_command(spec, python or sys.executable, spec_path)
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        except OSError as e:
            msg = f"cannot start the worker with framework.python={cmd[0]}: {e.strerror or e}"
            log.write(f"[fxtrack] {msg}\n".encode())
            return Result(spec.result_id, error=msg)
        tee = threading.Thread(target=_tee, args=(proc.stdout, log, echo, not spec.verbose),
                               daemon=True)
        tee.start()
        timed_out = _wait(proc, timeout_s)
        tee.join(timeout=10)
    return _outcome(spec, proc.returncode, timed_out, timeout_s, log_path)


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
    return [python, "-m", "torch.distributed.run", f"--nproc-per-node={spec.devices}", *where,
            *worker]


# Start-up chatter frameworks print whatever their log level (TensorFlow's oneDNN notice and absl
# preamble, XLA's plugin registration). Kept in worker.log, not shown unless verbose=true.
NOISE = re.compile(rb"^(WARNING: All log messages before absl::InitializeLog|I0000 |W0000 |E0000 "
                   rb"|.*oneDNN custom operations are on|.*Unable to register cu(DNN|FFT|BLAS) "
                   rb"factory|.*computation placer already registered|.*TF-TRT Warning"
                   rb"|.*This TensorFlow binary is optimized)")


def _tee(stream, log, echo: bool, quiet: bool = True) -> None:
    """Copy the worker's output to the log, and to the terminal without known noise lines."""
    for chunk in iter(lambda: stream.read1(4096), b""):
        log.write(chunk)
        log.flush()
        if echo:
            if quiet:
                chunk = b"".join(ln for ln in chunk.splitlines(keepends=True) if not NOISE.match(ln))
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for the worker; past ``timeout_s`` stop its whole process group. True if timed out."""
    try:
        proc.wait(timeout=timeout_s)
        return False
    except subprocess.TimeoutExpired:
        _kill_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
        return True


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _outcome(spec: JobSpec, code: int, timed_out: bool, timeout_s: float, log: Path) -> Result:
    result_path = Path(spec.result_path)
    result = Result.load(result_path) if result_path.exists() else Result(spec.result_id)
    if spec.node_rank != 0 and code == 0 and not timed_out:
        result.status = "FINISHED"  # a non-zero node writes no Result: node 0 reports for all
    if timed_out:
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
    """The end of the worker's log, for the worker.log artifact."""
    if not log.exists():
        return ""
    data = log.read_bytes()
    return data[-LOG_TAIL_BYTES:].decode(errors="replace")
