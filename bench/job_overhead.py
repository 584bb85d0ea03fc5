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
# The tiny job of issue 26: ViT at size=tiny on the CPU, the CPU defaults for batch and steps.
OVERRIDES = ["model=vit", "size=tiny", "hardware=cpu"]
MODULES = {"torch": "torch", "tensorflow": "tensorflow", "jax": "jax", "keras": "keras"}


def bare(spec_path: str) -> None:
    """The bare arm: the same training as the worker's, without anything of fxtrack around it
    but the backend that holds the model code."""
    from fxtrack import defaults
    from fxtrack.frameworks.declaration import declaration, import_path
    from fxtrack.job import JobSpec
    from fxtrack.worker.__main__ import prepare_environment

    spec = JobSpec.read(Path(spec_path))
    prepare_environment(spec)  # threads: the training must run as the worker runs it
    backend = import_path(declaration(spec.package).backend)(spec)
    kind = backend.device_kind()
    spec.compile, _ = declaration(spec.package).resolve_compile(kind, spec.arch["family"],
                                                                spec.compile_request,
                                                                dims=spec.arch["dims"],
                                                                precision=spec.precision)
    batch, steps, warmup = defaults.resolve(spec.arch["name"], kind, spec.batch_size, spec.steps,
                                            spec.warmup_steps)
    backend.build(batch)
    handles = [backend.train_step() for _ in range(warmup + steps)]
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
    """``env`` importing fxtrack from the checkout at ``root`` first."""
    return dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(root),
                                                              os.environ.get("PYTHONPATH")])))


def timed_run(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-3000:]}")
    return wall


def measure(framework: str, rounds: int, scratch: Path, compare: Path | None = None) -> dict:
    env = with_root(dict(os.environ, FXTRACK_HOME=str(scratch / "home")), ROOT)  # a scratch
    env.pop("MLFLOW_TRACKING_URI", None)  # spool; the peak FLOP/s cache is the user's own
    spec = compose_spec(framework, scratch)
    fx = [sys.executable, "-m", "fxtrack", f"framework={framework}", *OVERRIDES,
          f"tracking.uri=sqlite:///{scratch / 'mlflow.db'}", "tracking.experiment=overhead"]
    arms = {"fxtrack": (fx, env),
            "bare": ([sys.executable, str(Path(__file__).resolve()), "--bare", str(spec)], env)}
    if compare is not None:
        arms["compared"] = (fx, with_root(env, compare))
    for cmd, arm_env in arms.values():  # untimed: file cache, the store, a calibration
        timed_run(cmd, scratch, arm_env)
    got: dict[str, list[float]] = {arm: [] for arm in arms}
    order = list(arms)
    for r in range(rounds):
        for arm in order[r % len(order):] + order[:r % len(order)]:  # rotated round to round
            got[arm].append(timed_run(arms[arm][0], scratch, arms[arm][1]))
        print(f"{framework} round {r + 1}: " + ", ".join(f"{arm} {got[arm][-1]:.2f} s"
                                                         for arm in arms),
              file=sys.stderr, flush=True)
    return {"framework": framework, **got}


def summary(row: dict, arm: str = "fxtrack", label: str = "") -> str:
    from fxtrack import stats

    diffs = [f - b for f, b in zip(row[arm], row["bare"])]
    ci = stats.t_interval(diffs)
    fx, bare_s = stats.median(row[arm]), stats.median(row["bare"])
    return (f"{row['framework'] + label:<22} {len(diffs):>6} {fx:>11.2f} {bare_s:>8.2f}  "
            f"{f'{stats.median(diffs):+.2f} [{ci.low:+.2f}, {ci.high:+.2f}]':<24} {fx / bare_s:>6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", default="torch", help="comma-separated (default: torch)")
    parser.add_argument("--rounds", type=int, default=5, help="paired rounds after one untimed")
    parser.add_argument("--compare-root", type=Path, metavar="DIR",
                        help="also time fxtrack from this checkout, in the same rounds")
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
            rows.append(measure(fw, args.rounds, Path(tmp), args.compare_root))
    print(f"\n{' '.join(OVERRIDES)}, whole-process wall time, {args.rounds} paired rounds, "
          f"{os.cpu_count()} cores; difference = fxtrack - bare per round: median [95% t interval "
          "of the mean]")
    print(f"{'framework':<22} {'rounds':>6} {'fxtrack s':>11} {'bare s':>8}  {'difference s':<24} "
          f"{'ratio':>6}")
    for row in rows:
        print(summary(row))
        if "compared" in row:
            print(summary(row, "compared", f" ({args.compare_root.name})"))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
