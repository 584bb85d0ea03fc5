"""What fxtrack costs per job beyond the training itself: the whole-process wall time of a tiny
``python -m fxtrack ...`` run against a bare script doing the same training, each arm a fresh
process, in paired rounds.

  - fxtrack: ``python -m fxtrack framework=FW model=vit size=tiny hardware=cpu`` with a sqlite
    store in a scratch directory (and a scratch spool): Hydra, validation, the worker, the
    calibration lookup, the MLflow run, all of it;
  - bare: ``python bench/job_overhead.py --bare SPEC`` with the spec fxtrack itself composes for
    that command (written once, before the rounds): the worker's thread settings, the framework's
    backend (fxtrack's own model, optimiser and step, so the training is the same work), the
    same warm-up and timed steps, and nothing else: no Hydra, no MLflow, no worker process.

Each round runs both arms, the order alternating round to round; one untimed round first warms
the file cache and creates the store (and, on a machine with no cached peak FLOP/s, calibrates).
Reported per framework: each arm's median wall time, the median of the paired differences
(fxtrack - bare) and a 95% Student-t interval of their mean (fxtrack/stats.py), and the ratio.
The peak FLOP/s cache is the user's own ($FXTRACK_CACHE): a job after the first pays a lookup.

    python bench/job_overhead.py                          # torch, 5 rounds
    python bench/job_overhead.py --frameworks torch,jax --rounds 9
    git worktree add /tmp/before HEAD~3 && python bench/job_overhead.py --compare-root /tmp/before

``--compare-root DIR`` adds a third arm in the same rounds: fxtrack from another checkout (e.g.
before a change), so that a before/after comparison shares the machine's state, which on a
shared machine drifts more from minute to minute than the change itself.

``--itemise`` says where the difference goes (issue 46, item 3): every process of both arms
loads ``bench/marks/sitecustomize.py``, which appends a time mark wherever the job's time changes
hands (the orchestrator's interpreter, its job, the worker's start, its model built, the quiet
probe before its timed window, its steps, its exit, the run logged); each phase is the time
between two marks, per round, and the phases of an arm add up to its whole wall time. Printed
per phase: each arm's median and the paired difference's median [95% t interval of the mean].

    python bench/job_overhead.py --frameworks torch --rounds 8 --itemise

``--new-store`` gives every fxtrack run a store that does not exist yet, as a first run in a
new directory has (the README's command on a fresh checkout): the store's creation is timed
with the job.

    python bench/job_overhead.py --frameworks torch --rounds 8 --new-store --compare-root /tmp/before

Target (issue 26): fxtrack at most ~1.5 s above the bare script per tiny job.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKS = Path(__file__).resolve().parent / "marks"  # --itemise: its sitecustomize marks the time
# The tiny job of issue 26: ViT at size=tiny on the CPU, the CPU defaults for batch and steps.
OVERRIDES = ["model=vit", "size=tiny", "hardware=cpu"]
MODULES = {"torch": "torch", "tensorflow": "tensorflow", "jax": "jax", "keras": "keras"}


def bare(spec_path: str) -> None:
    """The bare arm: the same training as the worker's, without anything of fxtrack around it
    but the backend that holds the model code."""
    from fxtrack import architectures
    from fxtrack.frameworks.declaration import declaration, import_path
    from fxtrack.worker.protocol import JobSpec
    from fxtrack.worker.__main__ import prepare_environment

    spec = JobSpec.read(Path(spec_path))
    prepare_environment(spec)  # threads: the training must run as the worker runs it
    backend = import_path(declaration(spec.package).backend)(spec)
    kind = backend.device_kind()
    spec.compile, _ = declaration(spec.package).resolve_compile(kind, spec.arch["family"],
                                                                spec.compile_request,
                                                                dims=spec.arch["dims"],
                                                                precision=spec.precision)
    batch, steps, warmup = architectures.run_defaults(spec.arch["name"], kind, spec.batch_size,
                                                      spec.steps, spec.warmup_steps)
    mark = getattr(sys.modules.get("sitecustomize"), "mark", None)  # --itemise: bench/marks
    backend.build(batch)
    if mark is not None:
        mark("built")  # its steps start here: no gate, no probe
    handles = [backend.train_step() for _ in range(warmup + steps)]
    if mark is not None:
        mark("steps_end")
    print(f"bare: {warmup}+{steps} steps of batch {batch}, last loss "
          f"{backend.loss_value(handles[-1]):.4f}")


def compose_spec(framework: str, workdir: Path) -> Path:
    """The JobSpec fxtrack writes for the fxtrack arm's command, composed by fxtrack's config."""
    from hydra import compose, initialize_config_dir

    from fxtrack.config import register
    from fxtrack.config.validate import validate
    from fxtrack.orchestrator.job import job_spec
    from fxtrack.paths import CONF_DIR

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        conf, arch = validate(compose(config_name="config",
                                      overrides=[f"framework={framework}", *OVERRIDES]))
    spec = job_spec(conf, arch, workdir)
    spec.progress = False
    path = workdir / f"{framework}-spec.json"
    spec.dump(path)
    return path


def with_root(env: dict[str, str], root: Path) -> dict[str, str]:
    """``env`` importing from ``root`` first (a checkout of fxtrack, or bench/marks)."""
    return dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")])))


NEW_STORE = "{new store}"  # in a command: a store path no run has used


def timed_run(cmd: list[str], cwd: Path, env: dict[str, str]) -> float | dict[str, float]:
    """The run's wall time; with marks (``FXTRACK_BENCH_MARKS`` in ``env``), its phases."""
    if any(NEW_STORE in c for c in cmd):
        store = Path(tempfile.mkdtemp(prefix="store-", dir=cwd)) / "mlflow.db"
        cmd = [c.replace(NEW_STORE, str(store)) for c in cmd]
    marks = env.get("FXTRACK_BENCH_MARKS")
    if marks:
        Path(marks).unlink(missing_ok=True)
    start, t0 = time.time(), time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-3000:]}")
    return phases(Path(marks).read_text(), start, start + wall) if marks else wall


# (phase, from mark, to mark): "process mark" names, "start"/"end" the bench's own clock around
# the whole process. Each arm's phases run end to end, so they add up to its wall time.
PHASES = {
    "fxtrack": [
        ("interpreter start", "start", "orchestrator interpreter"),
        ("CLI, Hydra, validation, peak lookup", "orchestrator interpreter",
         "orchestrator job_run"),
        ("fallback held, spec written", "orchestrator job_run", "orchestrator worker_spawn"),
        ("worker's interpreter start", "orchestrator worker_spawn", "worker interpreter"),
        ("framework import, model build", "worker interpreter", "worker built"),
        ("gate: waits for MLflow and the store", "worker built", "worker probe_start"),
        ("quiet probe before the window", "worker probe_start", "worker probe_end"),
        ("window opened", "worker probe_end", "worker steps_start"),
        ("warm-up and timed steps", "worker steps_start", "worker steps_end"),
        ("worker: losses, result, exit", "worker steps_end", "orchestrator worker_exit"),
        ("enrich, log the run to MLflow", "orchestrator worker_exit", "orchestrator logged"),
        ("exit", "orchestrator logged", "end"),
    ],
    "bare": [
        ("interpreter start", "start", "bare interpreter"),
        ("framework import, model build", "bare interpreter", "bare built"),
        ("warm-up and timed steps", "bare built", "bare steps_end"),
        ("exit", "bare steps_end", "end"),
    ],
}
# Beside the phases, overlapping them: the orchestrator's MLflow import and store opening.
ALONGSIDE = ("MLflow import, store opened (alongside)", "orchestrator tracking_start",
             "orchestrator tracking_done")


def phases(text: str, start: float, end: float) -> dict[str, float]:
    """Seconds per phase of one run from its marks file (first mark of a name, last for the
    ends: a job times its steps once, the orchestrator logs once)."""
    at: dict[str, float] = {"start": start, "end": end}
    for line in text.splitlines():
        process, name, t = line.split()
        key = f"{process} {name}"
        if key not in at or name in ("steps_end", "logged", "worker_exit"):
            at[key] = float(t)
    arm = "fxtrack" if "orchestrator interpreter" in at else "bare"
    out = {"wall": end - start}
    for phase, a, b in PHASES[arm] + ([ALONGSIDE] if arm == "fxtrack" else []):
        if a not in at or b not in at:
            raise SystemExit(f"--itemise: no '{a if a not in at else b}' mark in this run; "
                             f"marks: {sorted(at)}")
        out[phase] = at[b] - at[a]
    return out


def arms_of(framework: str, scratch: Path, compare: Path | None = None,
            itemise: bool = False, new_store: bool = False
            ) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each arm's command and environment: fxtrack's tiny job, the bare script, and fxtrack
    from ``compare``; with ``itemise``, every process marks its phases (bench/marks); with
    ``new_store``, each fxtrack run creates its store."""
    env = with_root(dict(os.environ, FXTRACK_HOME=str(scratch / "home")), ROOT)  # a scratch
    env.pop("MLFLOW_TRACKING_URI", None)  # spool; the peak FLOP/s cache is the user's own
    if itemise:
        env = dict(with_root(env, MARKS), FXTRACK_BENCH_MARKS=str(scratch / "marks.txt"))
    spec = compose_spec(framework, scratch)
    fx = [sys.executable, "-m", "fxtrack", f"framework={framework}", *OVERRIDES,
          f"tracking.uri=sqlite:///{NEW_STORE if new_store else scratch / 'mlflow.db'}",
          "tracking.experiment=overhead"]
    arms = {"fxtrack": (fx, env),
            "bare": ([sys.executable, str(Path(__file__).resolve()), "--bare", str(spec)], env)}
    if compare is not None:
        arms["compared"] = (fx, with_root(env, compare))
    return arms


def measure(framework: str, rounds: int, scratch: Path, compare: Path | None = None,
            itemise: bool = False, new_store: bool = False) -> dict:
    arms = arms_of(framework, scratch, compare, itemise, new_store)
    for cmd, arm_env in arms.values():  # untimed: file cache, the store, a calibration
        timed_run(cmd, scratch, arm_env)
    got: dict[str, list[float]] = {arm: [] for arm in arms}
    split: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    order = list(arms)
    for r in range(rounds):
        for arm in order[r % len(order):] + order[:r % len(order)]:  # rotated round to round
            ran = timed_run(arms[arm][0], scratch, arms[arm][1])
            if isinstance(ran, dict):
                split[arm].append(ran)
                ran = ran["wall"]
            got[arm].append(ran)
        print(f"{framework} round {r + 1}: " + ", ".join(f"{arm} {got[arm][-1]:.2f} s"
                                                         for arm in arms),
              file=sys.stderr, flush=True)
    return {"framework": framework, **got, **({"phases": split} if itemise else {})}


def summary(row: dict, arm: str = "fxtrack", label: str = "") -> str:
    from fxtrack import stats

    diffs = [f - b for f, b in zip(row[arm], row["bare"])]
    ci = stats.t_interval(diffs)
    fx, bare_s = stats.median(row[arm]), stats.median(row["bare"])
    return (f"{row['framework'] + label:<22} {len(diffs):>6} {fx:>11.2f} {bare_s:>8.2f}  "
            f"{f'{stats.median(diffs):+.2f} [{ci.low:+.2f}, {ci.high:+.2f}]':<24} {fx / bare_s:>6.2f}")


def itemised(row: dict) -> str:
    """Per phase: each arm's median seconds and the paired difference (fxtrack - bare, 0 where
    bare has no such phase): median [95% t interval of the mean]. The mean differences add up
    to the mean difference of the whole processes."""
    from fxtrack import stats

    fx, bare_ = row["phases"]["fxtrack"], row["phases"]["bare"]
    lines = [f"{row['framework']}: where fxtrack's time goes, {len(fx)} paired rounds",
             f"  {'phase':<40} {'fxtrack s':>10} {'bare s':>8}  difference s"]
    names = [p for p, _, _ in PHASES["fxtrack"]] + ["wall", ALONGSIDE[0]]
    for name in names:
        a = [r[name] for r in fx]
        b = [r.get(name, 0.0) for r in bare_]
        diffs = [x - y for x, y in zip(a, b)]
        ci = stats.t_interval(diffs)
        bare_s = f"{stats.median(b):.3f}" if name in bare_[0] else "-"
        label = "whole process" if name == "wall" else name
        lines.append(f"  {label:<40} {stats.median(a):>10.3f} {bare_s:>8}  "
                     f"{stats.median(diffs):+.3f} [{ci.low:+.3f}, {ci.high:+.3f}]")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", default="torch", help="comma-separated (default: torch)")
    parser.add_argument("--rounds", type=int, default=5, help="paired rounds after one untimed")
    parser.add_argument("--compare-root", type=Path, metavar="DIR",
                        help="also time fxtrack from this checkout, in the same rounds")
    parser.add_argument("--itemise", action="store_true",
                        help="time each phase of both arms (bench/marks) and print where the "
                             "difference goes")
    parser.add_argument("--new-store", action="store_true",
                        help="every fxtrack run creates its store, as a first run does")
    parser.add_argument("--bare", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        bare(args.bare)
        return
    sys.path.insert(0, str(ROOT))
    rows = []
    for fw in args.frameworks.split(","):
        if importlib.util.find_spec(MODULES[fw]) is None:
            print(f"{fw}: not installed, skipped")
            continue
        with tempfile.TemporaryDirectory(prefix="fxtrack-overhead-") as tmp:
            rows.append(measure(fw, args.rounds, Path(tmp), args.compare_root, args.itemise,
                                args.new_store))
    store = ", each fxtrack run on a new store" if args.new_store else ""
    print(f"\n{' '.join(OVERRIDES)}{store}, whole-process wall time, {args.rounds} paired rounds, "
          f"{os.cpu_count()} cores; difference = fxtrack - bare per round: median [95% t interval "
          "of the mean]")
    print(f"{'framework':<22} {'rounds':>6} {'fxtrack s':>11} {'bare s':>8}  {'difference s':<24} "
          f"{'ratio':>6}")
    for row in rows:
        print(summary(row))
        if "compared" in row:
            print(summary(row, "compared", f" ({args.compare_root.name})"))
    for row in rows:
        if "phases" in row:
            print("\n" + itemised(row))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
