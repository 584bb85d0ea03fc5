"""Each framework's compile modes side by side, per model family: the figures behind the
``framework.compile=auto`` table (each ``fxtrack/frameworks/<fw>/__init__.py``), to re-derive it
on the machine at hand (a quiet CPU, a GPU).

    python bench/compile_modes.py                         # torch, tensorflow, jax x 4 families
    python bench/compile_modes.py --size tiny --rounds 3 --steps 3
    python bench/compile_modes.py --frameworks tensorflow --families vit,bert \\
        --set model.layers=4 --set model.image_size=64 --batch-size 8   # issue 26's setting
    python bench/compile_modes.py --reference     # at bench/reference.py's configs (full widths)

One fresh interpreter per framework (its environment is set before it is imported, as in the
worker). Per family, the job spec is composed from fxtrack's own config (``--size``, ``--set``
model.* overrides where the family takes the key, ``--precision``, ``--hardware``), and one
backend per mode is built the way the worker builds it (``timed.build`` with
``framework.compile=true`` / ``false``; same seed, same weights). Each mode's first step
(trace / compile) is untimed; then ``--rounds`` rounds, the modes in a rotated order each round
so that drift in the machine's load hits every mode alike, each round timing ``--steps`` steps
of every mode with the one step timer. The table gives each mode's median ms/step over the
rounds with a 95% interval (``fxtrack.stats.log_t_interval`` of the round medians), the ratio
compiled / uncompiled step time (the median of the paired per-round ratios, with its interval:
below 1, compiling is faster), which mode is faster (where that interval leaves out 1), and
which mode ``compile=auto`` picks for that cell. JAX declares one mode (jit); ``--all-modes`` times its op-by-op dispatch too.

Timing figures from a shared machine are contended: the share of the cores other processes
took over each framework's bench is printed; say "contended" when quoting them.
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
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = {"resnet": "resnet50", "vit": "vit", "bert": "bert", "llama": "llama"}
FRAMEWORKS = ("torch", "tensorflow", "jax", "keras")  # each the name of its module too
_ENVIRONMENT: list[str] = []  # the framework whose environment this process has set


def arms(framework: str, family: str, args: argparse.Namespace, workdir: Path
         ) -> tuple[Any, dict[bool, Any], dict[bool, float], str]:
    """(declaration, {compiled?: built backend}, {compiled?: first step s}, device kind) for
    one family: the spec the CLI would write, one backend per mode, each warmed up."""
    from hydra import compose, initialize_config_dir

    from fxtrack import families
    from fxtrack.cli import CONF_DIR
    from fxtrack.config import register
    from fxtrack.config.validate import validate
    from fxtrack.frameworks.declaration import declaration, import_path
    from fxtrack.worker.protocol import Result
    from fxtrack.orchestrator.job import job_spec
    from fxtrack.scenarios import timed
    from fxtrack.worker.__main__ import prepare_environment

    model = FAMILIES[family]
    keys = families.get(family).size_keys
    sets = [s for s in args.set if s.partition("=")[0].removeprefix("model.") in keys]
    size, batch = args.size, args.batch_size
    if args.reference:  # the reference bench's config of this model: its rows' sizes and batch
        sys.path.insert(0, str(ROOT / "bench"))
        import reference

        size = "full"
        sets = [f"model.{k}={v}" for k, v in reference.SIZES[model].items()] + sets
        batch = batch or reference.BATCHES.get(model, reference.BATCH)
    overrides = [f"framework={framework}", f"model={model}", f"size={size}",
                 f"precision={args.precision}", f"hardware={args.hardware}", f"seed={args.seed}",
                 *sets, *([f"batch_size={batch}"] if batch else [])]
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        conf, arch = validate(compose(config_name="config", overrides=overrides))
    fw = declaration(conf.framework.package)
    modes = (True, False) if args.all_modes else fw.tune_modes
    backends, first, kind = {}, {}, "?"
    for compiled in modes:
        spec = job_spec(conf, arch, workdir)
        spec.progress = False
        spec.compile_request = "true" if compiled else "false"
        if not _ENVIRONMENT:  # once, before the framework is imported, as in the worker
            prepare_environment(spec)
            _ENVIRONMENT.append(framework)
        backend = import_path(fw.backend)(spec)
        kind, _, _, _ = timed.build(backend, Result(result_id=spec.result_id))
        t0 = time.perf_counter()
        backend.train_step()  # traces / compiles, untimed
        first[compiled] = time.perf_counter() - t0
        for _ in range(args.warmup - 1):
            backend.train_step()
        backends[compiled] = backend
    return fw, backends, first, kind


def measure(framework: str, family: str, args: argparse.Namespace) -> dict[str, Any]:
    """One framework x family: rotated rounds over its modes; a JSON-able row."""
    from fxtrack import stats
    from fxtrack.measure.timer import percentile, time_steps

    with tempfile.TemporaryDirectory() as tmp:
        fw, backends, first, kind = arms(framework, family, args, Path(tmp))
        modes = list(backends)
        times: dict[bool, list[float]] = {m: [] for m in modes}
        for r in range(args.rounds):
            for compiled in modes[r % len(modes):] + modes[:r % len(modes)]:
                got = time_steps(backends[compiled].train_step, 0, args.steps, show=False)
                times[compiled].append(percentile(got.step_times_s, 50))
            print(f"{framework} {family} round {r + 1}/{args.rounds}: " + ", ".join(
                f"{fw.compile_mode_tag(m)} {times[m][-1] * 1e3:.1f} ms" for m in modes),
                file=sys.stderr, flush=True)
    row: dict[str, Any] = {"framework": framework, "family": family, "kind": kind, "modes": {}}
    for m in modes:
        ci = stats.log_t_interval(times[m])
        row["modes"][fw.compile_mode_tag(m)] = {
            "ms": [ci.point * 1e3, ci.low * 1e3, ci.high * 1e3], "first_s": first[m],
            "compiled": m}
    if len(modes) == 2:  # paired per round: compiled / uncompiled step time
        ratios = [c / u for c, u in zip(times[True], times[False])]
        ci = stats.log_t_interval(ratios)
        row["ratio"] = [ci.point, ci.low, ci.high]
        # a mode is faster only where the interval leaves out 1
        row["faster"] = (fw.compile_mode_tag(ci.high < 1) if ci.high < 1 or ci.low > 1
                         else "no clear difference")
    built = next(iter(backends.values()))
    auto, _ = fw.resolve_compile(kind, family, "auto", dims=built.arch.dims,
                                 precision=built.spec.precision)
    row["auto"] = fw.compile_mode_tag(auto)
    return row


def child(framework: str, args: argparse.Namespace) -> None:
    """Every family of one framework in this interpreter; one JSON line per family on stdout
    (a family that cannot be built, e.g. a model the framework lacks, says why)."""
    from fxtrack.measure import host_load as load

    for family in args.families.split(","):
        sampler = load.LoadSampler()
        try:
            with sampler:  # other processes' share of the cores over this family's bench
                row = measure(framework, family, args)
        except Exception as e:  # noqa: BLE001 - one row's failure is that row's cell
            traceback.print_exc()
            row = {"framework": framework, "family": family,
                   "error": f"{type(e).__name__}: {e}".splitlines()[0][:160]}
        row["other_cpu_frac"] = sampler.other_cpu_frac
        print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", default="torch,tensorflow,jax",
                        help="of torch, tensorflow, jax, keras")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--size", default="tiny", choices=("tiny", "full"))
    parser.add_argument("--set", action="append", default=[], metavar="model.KEY=VALUE",
                        help="a model override, applied to the families that take the key")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--hardware", default="cpu", help="cpu | gpu | auto")
    parser.add_argument("--batch-size", type=int, default=None, help="default: the device's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per mode per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per mode, first "
                                                              "(trace / compile) included")
    parser.add_argument("--reference", action="store_true",
                        help="each family at bench/reference.py's config (full widths, its "
                             "sizes and batch) instead of --size/--batch-size")
    parser.add_argument("--all-modes", action="store_true",
                        help="time compiled and uncompiled even where a framework declares one")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args)
        return
    print(header(args), flush=True)
    for fw in args.frameworks.split(","):
        if fw not in FRAMEWORKS or importlib.util.find_spec(fw) is None:
            print(f"{fw}: not installed, skipped", flush=True)
            continue
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        # each row printed as its family finishes: a long bench stopped early keeps its rows
        with subprocess.Popen([sys.executable, __file__, "--child", fw, *sys.argv[1:]], env=env,
                              stdout=subprocess.PIPE, text=True) as child_process:
            for line in child_process.stdout:
                if line.startswith("{"):
                    print(row_lines(json.loads(line)), flush=True)


def header(args: argparse.Namespace) -> str:
    sets = " ".join(args.set) or "-"
    size = "bench/reference.py's configs" if args.reference else f"size={args.size}"
    return (f"{size} {sets} batch {args.batch_size or 'default'}, {args.precision}, "
            f"hardware={args.hardware}, {args.rounds} rotated rounds x {args.steps} steps; "
            "median ms/step [95% interval]; ratio = compiled / uncompiled step time, paired per "
            "round [95% interval]\n"
            f"{'framework':<11} {'family':<7} {'mode':<17} {'ms/step':<26} {'first s':>8} "
            f"{'ratio':<22} {'faster':<19} {'auto':<16} {'other CPU':>9}")


def row_lines(row: dict[str, Any]) -> str:
    """One framework x family: a line per mode."""
    other = row.get("other_cpu_frac")
    other = "n/a" if other is None else f"{other:.0%}"
    if "error" in row:
        return f"{row['framework']:<11} {row['family']:<7} not measured: {row['error']}"
    ratio = row.get("ratio")
    ratio = "-" if ratio is None else f"{ratio[0]:.2f} [{ratio[1]:.2f}, {ratio[2]:.2f}]"
    out = []
    for i, (mode, m) in enumerate(row["modes"].items()):
        ms = f"{m['ms'][0]:.1f} [{m['ms'][1]:.1f}, {m['ms'][2]:.1f}]"
        line = (f"{row['framework'] if i == 0 else '':<11} {row['family'] if i == 0 else '':<7} "
                f"{mode:<17} {ms:<26} {m['first_s']:>8.1f}")
        if i == 0:  # the cell's figures, once
            line += f" {ratio:<22} {row.get('faster', '-'):<19} {row['auto']:<16} {other:>9}"
        out.append(line)
    return "\n".join(out)


if __name__ == "__main__":
    main()
