"""Try what a skeptical operator would, in every framework, and sort each outcome as issue 60's
table does: clear (a refusal in one line before any work), valid (handled: the run or its
parent recorded as what happened), confusing, lost, traceback, hang, orphan.

Each case runs in a scratch directory of its own (its own store, spool and peak cache) with real
``python -m fxtrack`` processes; signals are sent to the real orchestrator or worker once the
worker has built its model. The verdict is computed from what is left behind, not assumed:

  - hang: the command ran past its limit;
  - orphan: a process still mentions the case's directory afterwards;
  - traceback: "Traceback (most recent call last)" on the terminal;
  - lost: a case that should leave a run (a signal, a spooled result) left none, in the store
    or the spool, or one still RUNNING after ``fxtrack sync``;
  - clear / valid: the case's own expectation (exit status, the words said, the record);
  - confusing: anything else, with what was seen.

    python bench/failure_modes.py                         # torch, tensorflow, jax, keras
    python bench/failure_modes.py --frameworks torch --only seed,sigint-worker
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model=vit", "size=tiny", "batch_size=2", "warmup_steps=1", "hardware=cpu"]
LIMIT_S = 240
VERDICTS = ("clear", "valid", "confusing", "lost", "traceback", "hang", "orphan")
PASSWORD = "s3cret-PW-failure-modes"


class Case:
    def __init__(self, name: str, args: list[str], expect: str, said: str = "",
                 signal_to: Optional[tuple[str, int]] = None, sub: bool = False,
                 prepare: Optional[Callable[[Path], list[str]]] = None,
                 after: Optional[Callable[[Path, subprocess.CompletedProcess], str]] = None,
                 per_framework: bool = True) -> None:
        """``expect``: "refused" (exit 2, ``said`` in its one line, nothing logged), "recorded"
        (a signal: ``after`` judges the store), "line" (a sub-command's one line, exit != 0)."""
        self.name, self.args, self.expect, self.said = name, args, expect, said
        self.signal_to, self.sub, self.prepare, self.after = signal_to, sub, prepare, after
        self.per_framework = per_framework


def env_for(cwd: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(FXTRACK_HOME=str(cwd / "home"), FXTRACK_CACHE=str(cwd / "cache"))
    return env


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                state = (entry / "stat").read_text().split(") ", 1)[1][0]
            except (OSError, IndexError):
                continue
            if text in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


def built_worker(cwd: Path) -> Optional[int]:
    """A worker of this case that passed its gate (its model is built)."""
    for pid in processes_mentioning(str(cwd)):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"fxtrack.worker" not in cmd:
            continue
        fd = next((v.split(b"=", 1)[1].decode() for v in environ
                   if v.startswith(b"FXTRACK_GATE_FD=")), None)
        if fd is None or not Path(f"/proc/{pid}/fd/{fd}").exists():
            return pid
    return None


def runs_of(cwd: Path) -> list:
    db = cwd / "mlflow.db"
    if not db.exists():
        return []
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("fxtrack")
    return client.search_runs([exp.experiment_id]) if exp else []


def spooled(cwd: Path) -> list[Path]:
    spool = cwd / "home" / "spool"
    return [p for p in spool.iterdir() if p.is_dir() and p.name != "bad"] if spool.is_dir() else []


def run_case(case: Case, framework: Optional[str]) -> tuple[str, str]:
    cwd = Path(tempfile.mkdtemp(prefix=f"fxfail-{case.name}-"))
    args = [*case.args, *(case.prepare(cwd) if case.prepare else [])]
    if framework is not None:  # after a sweep's -m, which Hydra takes first
        at = 1 if args[:1] == ["-m"] else 0
        args = [*args[:at], f"framework={framework}", *args[at:]]
    cmd = [sys.executable, "-m", "fxtrack", *args]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env_for(cwd), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        if case.signal_to is not None:
            target, sig = case.signal_to
            while time.monotonic() - started < LIMIT_S and proc.poll() is None:
                worker = built_worker(cwd)
                if worker is not None:
                    time.sleep(0.5)  # into its steps
                    os.kill(worker if target == "worker" else proc.pid, sig)
                    break
                time.sleep(0.2)
        out, err = proc.communicate(timeout=max(1.0, LIMIT_S - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "hang", f"still running after {LIMIT_S} s"
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    time.sleep(1.0)  # what a worker or a UI left is gone by now, or an orphan
    left = processes_mentioning(str(cwd))
    if left:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return "orphan", f"{len(left)} processes left"
    text = out + err
    if "Traceback (most recent call last)" in text or PASSWORD in text:
        return "traceback" if PASSWORD not in text else "confusing", \
            "a traceback on the terminal" if PASSWORD not in text else "the password shown"
    if case.expect == "refused":
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if done.returncode == 2 and len(lines) == 1 and case.said in lines[0] \
                and not runs_of(cwd) and not spooled(cwd):
            return "clear", lines[0][:140]
        return "confusing", f"exit {done.returncode}: {(lines or ['(nothing said)'])[-1][:140]}"
    if case.expect == "line":
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if done.returncode != 0 and len(lines) == 1 and case.said in lines[0]:
            return "clear", lines[0][:140]
        return "confusing", f"exit {done.returncode}: {(lines or ['(nothing said)'])[-1][:140]}"
    return case.after(cwd, done)


def recorded(status: str, said: str, sync: bool = False) -> Callable:
    """A signal's case: after an optional ``fxtrack sync``, its runs carry ``status`` with
    ``said`` in the error, nothing is RUNNING and nothing is left in the spool."""
    def after(cwd: Path, done: subprocess.CompletedProcess) -> str:
        if sync:
            subprocess.run([sys.executable, "-m", "fxtrack", "sync"], cwd=cwd, env=env_for(cwd),
                           capture_output=True, timeout=300)
        runs = runs_of(cwd)
        if not runs:
            return "lost", f"no run in the store ({len(spooled(cwd))} spooled)"
        if any(r.info.status == "RUNNING" for r in runs):
            return "lost", "a run still RUNNING"
        if spooled(cwd):
            return "lost", f"{len(spooled(cwd))} left in the spool"
        mine = [r for r in runs if r.info.status == status
                and said in r.data.tags.get("fxtrack.error", "")]
        if not mine:
            seen = {(r.info.status, r.data.tags.get("fxtrack.error", "")[:60]) for r in runs}
            return "confusing", f"expected {status} '{said}', saw {sorted(seen)}"
        kept = [r for r in runs if r.data.metrics.get("throughput_samples_per_s")]
        return "valid", f"{status}: {said}" + (f" ({len(kept)} with figures)" if kept else "")
    return after


def npz_file(shape_x, labels) -> Callable[[Path], list[str]]:
    def make(cwd: Path) -> list[str]:
        import numpy as np

        path = cwd / "data.npz"
        np.savez(path, x=np.zeros(shape_x, np.float32), y=np.asarray(labels))
        return [f"data.path={path}"]
    return make


def outputs_a_file(cwd: Path) -> list[str]:
    (cwd / "outputs").write_text("not a directory")
    return []


def evil_claims(cwd: Path) -> list[str]:
    (cwd / "evil.yaml").write_text("- !!python/object/apply:os.system ['true']\n")
    return ["--claims", str(cwd / "evil.yaml")]


CONVERGE = ["scenario=converge", "data=file", "model.patch=4", "scenario.metric=accuracy",
            "scenario.target=0.9", "scenario.max_epochs=1", "scenario.eval_every=2",
            "scenario.lr=0.01", "batch_size=4"]
CASES = [
    Case("threads", [*TINY, "hardware.cpu_threads=100000"], "refused", "hardware.cpu_threads"),
    Case("seed", [*TINY, "seed=99999999999999999999"], "refused", "seed must be an integer"),
    Case("negative-seed", [*TINY, "seed=-1"], "refused", "seed must be an integer"),
    Case("zero-batch", [*TINY, "batch_size=0"], "refused", "batch_size"),
    Case("typo-key", [*TINY, "model.layer=2"], "refused", "model.layer"),
    Case("buckets", ["scenario=serve", "model=llama", "size=tiny", "hardware=cpu",
                     "scenario.batch_buckets=[0,8]"], "refused", "each 1 or more"),
    Case("wide-file", [*TINY, *CONVERGE], "refused", "features",
         prepare=npz_file((50, 100_000), [0, 1] * 25)),
    Case("far-labels", [*TINY, *CONVERGE], "refused", "classes",
         prepare=npz_file((48, 8, 8), [0, 1, 1_000_000] * 16)),
    Case("one-class", [*TINY, *CONVERGE], "refused", "one class",
         prepare=npz_file((48, 8, 8), [0] * 48)),
    Case("outputs-is-a-file", [*TINY], "refused", "outputs", prepare=outputs_a_file),
    Case("sigint-worker", [*TINY, "steps=400"], "recorded", signal_to=("worker", signal.SIGINT),
         after=recorded("KILLED", "interrupted by SIGINT")),
    Case("sigint-converge-worker", ["scenario=converge", "data=mnist", "model=vit", "size=tiny",
                                    "hardware=cpu", "model.patch=4"], "recorded",
         signal_to=("worker", signal.SIGINT), after=recorded("KILLED", "interrupted by SIGINT")),
    Case("sigkill-worker", [*TINY, "steps=400"], "recorded", signal_to=("worker", signal.SIGKILL),
         after=recorded("FAILED", "killed by SIGKILL")),
    Case("sigterm-orchestrator", [*TINY, "steps=400"], "recorded",
         signal_to=("orchestrator", signal.SIGTERM), after=recorded("KILLED", "SIGTERM")),
    Case("sigkill-orchestrator", [*TINY, "steps=400"], "recorded",
         signal_to=("orchestrator", signal.SIGKILL),
         after=recorded("FAILED", "orchestrator was gone", sync=True)),
    Case("repeats-sigint", ["-m", *TINY, "steps=4", "repeats=2", "seed=0,1"], "recorded",
         signal_to=("orchestrator", signal.SIGINT), after=recorded("KILLED", "interrupted")),
    Case("repeats-sigkill", ["-m", *TINY, "steps=4", "repeats=2", "seed=0,1"], "recorded",
         signal_to=("orchestrator", signal.SIGKILL),
         after=recorded("FAILED", "orchestrator was gone", sync=True)),
    Case("server-down", [*TINY, "steps=2", f"tracking.uri=http://u:{PASSWORD}@127.0.0.1:9"],
         "recorded", after=lambda cwd, done: (
             ("valid", "spooled, said so, exit 1") if done.returncode == 1 and spooled(cwd)
             and not any(PASSWORD in p.read_text(errors="ignore") for p in cwd.rglob("*")
                         if p.is_file() and p.suffix in (".json", ".yaml", ".log", ".txt"))
             else ("lost" if not spooled(cwd) else "confusing",
                   f"exit {done.returncode}, {len(spooled(cwd))} spooled"))),
    Case("evil-claims", ["claims"], "line", "not plain YAML", prepare=evil_claims,
         per_framework=False),
    Case("report-password", ["report", "--uri", f"http://u:{PASSWORD}@127.0.0.1:9"], "line",
         "127.0.0.1:9", per_framework=False),
    Case("ui-unreachable", ["ui", "--uri", "http://127.0.0.1:9"], "line", "127.0.0.1:9",
         per_framework=False),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", default="torch,tensorflow,jax,keras")
    parser.add_argument("--only", default="", help="comma-separated case names")
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    rows, counts = [], Counter()
    for case in CASES:
        if only and case.name not in only:
            continue
        for fw in (args.frameworks.split(",") if case.per_framework else [None]):
            t0 = time.monotonic()
            verdict, why = run_case(case, fw)
            counts[verdict] += 1
            rows.append((case.name, fw or "-", verdict, f"{time.monotonic() - t0:.0f}", why))
            print(f"{case.name:<22} {fw or '-':<11} {verdict:<10} {rows[-1][3]:>4} s  {why}",
                  flush=True)
    print("\n" + ", ".join(f"{counts[v]} {v}" for v in VERDICTS) + f" ({len(rows)} cases)")
    print(json.dumps({"counts": counts, "rows": rows}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
