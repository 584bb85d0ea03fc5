"""Every framework's training step at the reference sizes as a fraction of the calibrated peak,
in one table (issue 46, item 1).

    python bench/mfu.py --repeats 3                       # the table, printed (hours on 2 cores)
    python bench/mfu.py --repeats 3 --out docs/results/mfu-<machine>.md
    python bench/mfu.py --frameworks torch,jax --families vit --precisions bf16 --profile
    python bench/mfu.py --size tiny --repeats 2 --set steps=2 --set warmup_steps=1   # a smoke run

Cells: framework (torch, tensorflow, jax, and keras on ``KERAS_BACKEND``) x reference model
(ViT-B/16, BERT-base, ResNet-50, the Llama 1B dims at ``LLAMA``) x precision (fp32, bf16), all at
``framework.compile=auto``. Each cell is fxtrack's own job through its CLI
(``python -m fxtrack scenario=train ... repeats=N``) in a subprocess of its own, one cell after
the other, logging to one MLflow store (``--store``; default a fresh sqlite store in a temporary
directory, whose path is printed); the table then reads the runs back
(``fxtrack.tracking.reader.load_runs``, the report's reader), so each figure is what a run logged.

Per cell, over the repeats (``fxtrack.stats``: the median, and the 95% t interval of the mean
log, ``log_t_interval``):

- MFU, computed here from each repeat's logged figures exactly as the job computes its ``mfu``
  (``fxtrack/scenarios/timed.py`` and ``fxtrack/orchestrator/calibration.py:mfu_metrics``):
  ``flops_per_sample`` x ``throughput_samples_per_s`` (the timed window's samples over its wall
  time) / (devices x ``peak_tflops``). Marked ``*`` below 60%. No MFU where the run logged no
  peak it may be divided by (the calibration was contended or stopped): the cell says which.
- step time p50 (``step_time_ms_p50``), the peak (``peak_tflops``) and where it came from
  (tag ``fxtrack.peak_tflops_source``), the repeats that finished.
- with ``--profile`` (``scenario.profile_steps=1``): the time split of one profiled step, the
  ``profile_*_ms`` metrics, wherever the runs logged them.

A cell that cannot run says why: the CLI's refusal (``fxtrack: not supported, nothing was
run: ...``, ``will not fit in memory``) or the failed run's ``fxtrack.error``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ("torch", "tensorflow", "jax", "keras")
FAMILIES = ("vit", "bert", "resnet50", "llama")  # fxtrack's model names of the reference sizes
PRECISIONS = ("fp32", "bf16")
# Keras' best backend: JAX, its default, the one whose step Keras compiles at compile=auto on
# every device (on torch it stays eager, on TensorFlow a plain tf.function without a GPU).
KERAS_BACKEND = "jax"
# The 1B Llama's dims at a batch and sequence whose training floor (fxtrack/config/memory.py:
# AdamW state, the bf16 weight copy, activations, logits) stays within 90% of 24 GiB at both
# precisions: 19.5 GiB fp32, 21.4 GiB bf16 (seq 512 would need 22.2 GiB at bf16).
LLAMA = {"batch_size": 1, "model.seq_len": 256}
LLAMA_BUDGET_GIB, LLAMA_MARGIN = 24, 0.9
MFU_TARGET = 0.60  # issue 46: cells below it are where item 2 looks for the time
REASON = 160  # characters of a cell's reason in the table
PROFILE = ("matmul", "attention", "norm_elementwise", "optimizer", "overhead", "step",
           "timed_step", "unprofiled_step")


def cells(args: argparse.Namespace) -> list[dict[str, str]]:
    """The cells in table order: per model and precision, the frameworks side by side."""
    return [{"framework": fw, "model": model, "precision": precision}
            for model in args.families for precision in args.precisions
            for fw in args.frameworks]


def label(cell: dict[str, str]) -> str:
    fw = f"keras-{KERAS_BACKEND}" if cell["framework"] == "keras" else cell["framework"]
    return f"{fw} {cell['model']} {cell['precision']}"


def command(cell: dict[str, str], args: argparse.Namespace, experiment: str) -> list[str]:
    """The cell's fxtrack command: the job as a user would run it."""
    cmd = [sys.executable, "-m", "fxtrack", "scenario=train", f"framework={cell['framework']}",
           f"model={cell['model']}", f"precision={cell['precision']}", "framework.compile=auto",
           f"size={args.size}", f"repeats={args.repeats}", f"tracking.uri={args.store}",
           f"tracking.experiment={experiment}"]
    if cell["framework"] == "keras":
        cmd.append(f"framework.keras_backend={KERAS_BACKEND}")
    if cell["model"] == "llama" and args.size == "full":
        cmd += [f"{key}={value}" for key, value in LLAMA.items()]
    if args.profile:  # the option issue 46's profile split adds to scenario=train
        cmd.append("scenario.profile_steps=1")
    return cmd + args.set


def run_cell(cell: dict[str, str], args: argparse.Namespace, experiment: str, workdir: Path,
             env: dict[str, str]) -> Optional[str]:
    """Run the cell's job; None when the CLI ended well, else its own one-line reason (a
    refusal before any work, a crash): a failed run's ``fxtrack.error`` is read from the store."""
    cwd = workdir / label(cell).replace(" ", "-")
    cwd.mkdir(parents=True, exist_ok=True)  # Hydra's outputs/ and the cell's log land here
    with open(cwd / "fxtrack.log", "w") as log:
        out = subprocess.run(command(cell, args, experiment), cwd=cwd, env=env, text=True,
                             stdout=log, stderr=subprocess.PIPE)
        log.write(out.stderr)
    if out.returncode == 0:
        return None
    return why_failed(out.stderr, out.returncode)


def why_failed(stderr: str, returncode: int) -> str:
    """The CLI's own one-line reason (``fxtrack: ...``), else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("fxtrack: ")]
    if said:
        return said[0][len("fxtrack: "):]
    hints = ("Set the environment variable HYDRA_FULL_ERROR",)
    lines = [line for line in lines if not line.startswith(hints)]
    return lines[-1] if lines else f"the job exited with status {returncode}"


# ----------------------------------------------------------------------------- reading the runs

def runs_of(frame: Any, cell: dict[str, str]) -> Any:
    """The cell's runs in the experiment (one per framework, model and precision)."""
    if frame is None or not len(frame):
        return frame
    mine = (frame["tags.fxtrack.framework"] == cell["framework"]) & \
           (frame["tags.fxtrack.model"] == cell["model"]) & \
           (frame["tags.fxtrack.precision"] == cell["precision"])
    return frame[mine]


def mfu_of(row: Any) -> Optional[float]:
    """One run's MFU from its logged figures, as the job computes ``mfu``; None where it logged
    no FLOP count, throughput or peak."""
    from fxtrack.report.select import metric

    flops, rate = metric(row, "flops_per_sample"), metric(row, "throughput_samples_per_s")
    peak = metric(row, "peak_tflops")
    if None in (flops, rate, peak) or not peak:
        return None
    return flops * rate / 1e12 / (int(row["tags.fxtrack.devices"]) * peak)


def figures(runs: Any) -> dict[str, Any]:
    """A cell's figures from its runs (the repeats; an aggregate run is read for nothing)."""
    from fxtrack import stats
    from fxtrack.report.select import metric

    if runs is None or not len(runs):
        return {"reason": "no run was logged"}
    kind = runs.get("tags.fxtrack.kind")
    repeats = runs[kind != "aggregate"] if kind is not None else runs
    done = repeats[repeats["status"] == "FINISHED"]
    failed = repeats[repeats["status"] != "FINISHED"]
    out: dict[str, Any] = {"repeats": len(done), "asked": len(repeats)}
    if len(failed):
        errors = failed.get("tags.fxtrack.error")
        error = next((e for e in (errors if errors is not None else []) if isinstance(e, str)),
                     None)
        out["failed"] = f"{len(failed)} of {len(repeats)} repeats failed: " \
                        f"{error or failed['status'].iloc[0]}"
    if not len(done):
        out["reason"] = out.pop("failed", "no repeat finished")
        return out
    rows = [row for _, row in done.iterrows()]
    tag = lambda row, key: row.get(f"tags.fxtrack.{key}")  # noqa: E731
    out["steps_ms"] = [metric(row, "step_time_ms_p50") for row in rows]
    out["logged_mfu"] = [metric(row, "mfu") for row in rows]
    out["mfu"] = [mfu_of(row) for row in rows]
    peaks = [metric(row, "peak_tflops") for row in rows]
    out["peak"] = stats.median(peaks) if None not in peaks else None
    out["source"] = tag(rows[0], "peak_tflops_source") or "-"
    out["contended"] = sum(tag(row, "contended") == "true" for row in rows)
    if None in out["logged_mfu"]:  # the job divided by no peak: neither does the table
        row = rows[out["logged_mfu"].index(None)]
        if tag(row, "peak_contended") == "true":
            out["no_mfu"] = "no MFU: the peak was calibrated under contention " \
                            "(fxtrack.peak_contended); calibrate on a quiet machine"
        elif isinstance(tag(row, "calibration_stopped"), str):
            out["no_mfu"] = f"no MFU: calibration stopped ({tag(row, 'calibration_stopped')})"
        else:
            out["no_mfu"] = "no MFU: the run logged no peak or FLOP count"
        out["mfu"] = []
    if None in out["mfu"]:
        out["no_mfu"], out["mfu"] = "no MFU: the run logged no peak or FLOP count", []
    for part in PROFILE:
        values = [metric(row, f"profile_{part}_ms") for row in rows]
        if None not in values:
            out[f"profile_{part}_ms"] = stats.median(values)
    return out


# ----------------------------------------------------------------------------------- the table

def _interval(xs: list[float], scale: float = 1.0, digits: int = 1) -> str:
    from fxtrack import stats

    ci = stats.log_t_interval(xs)
    return f"{ci.point * scale:,.{digits}f} [{ci.low * scale:,.{digits}f}, " \
           f"{ci.high * scale:,.{digits}f}]"


def table(rows: list[tuple[dict[str, str], dict[str, Any]]], args: argparse.Namespace) -> Any:
    """The one table, for fxtrack's renderer (fxtrack.report.render)."""
    from fxtrack import architectures, stats
    from fxtrack.report.tables import Table

    profiled = [p for p in PROFILE if any(f"profile_{p}_ms" in f for _, f in rows)]
    header = ["model", "precision", "framework", "MFU % [95%]", "step p50 ms [95%]",
              "peak TFLOP/s", "peak source", "repeats",
              *[f"{p.replace('_', '/')} ms" for p in profiled], "note"]
    out = []
    for cell, f in rows:
        fw = f"keras-{KERAS_BACKEND}" if cell["framework"] == "keras" else cell["framework"]
        head = [architectures.display_name(cell["model"]), cell["precision"], fw]
        if "reason" in f:  # whole in the progress line and the cell's log; its start here
            reason = f["reason"] if len(f["reason"]) <= REASON else f["reason"][:REASON] + "..."
            out.append(head + ["-"] * (len(header) - 4) + [reason])
            continue
        mfu = "-"
        if f["mfu"]:
            mfu = _interval(f["mfu"], 100) + (" *" if stats.median(f["mfu"]) < MFU_TARGET else "")
        notes = [f[k] for k in ("no_mfu", "failed") if k in f]
        if f["contended"]:
            notes.append(f"contended ({f['contended']} of {f['repeats']} repeats)")
        out.append(head + [mfu, _interval(f["steps_ms"], digits=2 if max(f["steps_ms"]) < 10
                                          else 1),
                           "-" if f["peak"] is None else f"{f['peak']:,.3f}", f["source"],
                           f"{f['repeats']}/{f['asked']}",
                           *[f"{f[f'profile_{p}_ms']:,.1f}" if f"profile_{p}_ms" in f else "-"
                             for p in profiled],
                           "; ".join(notes)])
    notes = [f"MFU = flops_per_sample x throughput_samples_per_s / (devices x peak_tflops), each "
             f"repeat's logged figures, as the job computes its mfu; median over the repeats "
             f"[95% t interval of the mean log]; * below {MFU_TARGET:.0%} of the peak",
             "framework.compile=auto; keras on its " + KERAS_BACKEND + " backend; "
             + (f"{architectures.display_name('llama')} at batch {LLAMA['batch_size']} x "
                f"{LLAMA['model.seq_len']} tokens (its training floor within "
                f"{LLAMA_MARGIN:.0%} of {LLAMA_BUDGET_GIB} GiB)" if args.size == "full"
                else "size=tiny: a smoke run, not a measurement")]
    if args.set:  # after the cell's own overrides, so these win (framework.compile=... included)
        notes.append("--set " + " ".join(args.set))
    if profiled:
        notes.append("profile columns: one profiled step's time split (the profile_*_ms "
                     "metrics), median over the repeats")
    return Table("MFU at the reference sizes (train, x1)", header, out, notes)


def machine() -> list[str]:
    """The machine as fxtrack describes a host (its run tags), for the markdown's header."""
    from fxtrack.environment import host_tags

    tags = host_tags()
    return [f"machine: {tags.get('fxtrack.cpu', '?')}, {os.cpu_count()} cores, host "
            f"{tags.get('fxtrack.host', '?')}; python {tags.get('fxtrack.python', '?')}, "
            f"fxtrack {tags.get('fxtrack.version', '?')} at {tags.get('fxtrack.git_commit', '?')[:12]}"]


# ----------------------------------------------------------------------------------------- main

class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, before any work (argparse's own adds its usage)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _names(allowed: tuple[str, ...], what: str):
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(map(repr, unknown)) or repr(text)}; choose from "
                f"{', '.join(allowed)}")
        return names
    return parse


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(text)


def _override(text: str) -> str:
    if "=" not in text or text.startswith("="):
        raise argparse.ArgumentTypeError(f"must be KEY=VALUE (a fxtrack override), got {text!r}")
    return text


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser(prog="bench/mfu.py", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=_positive, default=3, help="runs per cell (default 3)")
    parser.add_argument("--frameworks", type=_names(FRAMEWORKS, "framework"),
                        default=list(FRAMEWORKS), help=f"comma-separated: {','.join(FRAMEWORKS)}")
    parser.add_argument("--families", type=_names(FAMILIES, "family"), default=list(FAMILIES),
                        help=f"comma-separated models: {','.join(FAMILIES)}")
    parser.add_argument("--precisions", type=_names(PRECISIONS, "precision"),
                        default=list(PRECISIONS), help=f"comma-separated: {','.join(PRECISIONS)}")
    parser.add_argument("--size", choices=("full", "tiny"), default="full",
                        help="full: the reference sizes (default); tiny: a smoke run")
    parser.add_argument("--store", default=None,
                        help="MLflow tracking URI (default: a fresh sqlite store in a temporary "
                             "directory)")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the table to this markdown file, with the machine, the "
                             "date and the command")
    parser.add_argument("--profile", action="store_true",
                        help="profile one step per run (scenario.profile_steps=1): the time "
                             "split columns")
    parser.add_argument("--set", action="append", type=_override, default=[],
                        metavar="KEY=VALUE", help="another fxtrack override for every cell, "
                        "e.g. --set steps=5 (repeatable)")
    args = parser.parse_args(argv)
    if args.out is not None and not args.out.resolve().parent.is_dir():
        parser.error(f"--out: no directory {args.out.resolve().parent}")
    if args.store is not None and "://" not in args.store:
        parser.error(f"--store must be an MLflow tracking URI (sqlite:///PATH, http://...), "
                     f"got {args.store!r}")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    started = datetime.datetime.now(datetime.timezone.utc)
    workdir = Path(tempfile.mkdtemp(prefix="fxtrack-mfu-"))
    args.store = args.store or f"sqlite:///{workdir / 'mlflow.db'}"
    experiment = f"mfu-{started:%Y%m%d-%H%M%S}"  # this table's runs, whatever else the store holds
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                                    os.environ.get("PYTHONPATH")])))
    todo = cells(args)
    print(f"[mfu] {len(todo)} cells, {args.repeats} repeats each, into {args.store} "
          f"(experiment {experiment}); logs under {workdir}", file=sys.stderr, flush=True)
    refused: dict[int, str] = {}
    for i, cell in enumerate(todo):
        t0 = time.perf_counter()
        print(f"[mfu] {i + 1}/{len(todo)} {label(cell)}: started {time.strftime('%H:%M:%S')}",
              file=sys.stderr, flush=True)
        why = run_cell(cell, args, experiment, workdir, env)
        if why is not None:
            refused[i] = why
        print(f"[mfu] {i + 1}/{len(todo)} {label(cell)}: {'ended' if why is None else why} "
              f"after {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    from fxtrack.report import render
    from fxtrack.report.tables import Section
    from fxtrack.tracking import reader

    try:
        frame = reader.load_runs(args.store, experiment)
    except (reader.ExperimentNotFound, reader.NoRunsFound):
        frame = None  # every cell was refused before any work
    rows = []
    for i, cell in enumerate(todo):
        f = figures(runs_of(frame, cell))
        if i in refused and f.get("reason") == "no run was logged":
            f["reason"] = refused[i]
        rows.append((cell, f))
    result = table(rows, args)
    print(render.text_table(result))
    if args.out is not None:
        command = shlex.join(["python", "bench/mfu.py", *argv])
        meta = [*machine(), f"date: {started:%Y-%m-%d %H:%M} UTC", f"command: {command}",
                f"runs: {args.store}, experiment {experiment}"]
        args.out.write_text(render.markdown(render.Report(
            result.title, meta, [Section("MFU per framework, model and precision", [result])],
            [])))
        print(f"[mfu] written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
