"""GPU validation at canonical size, runnable where only PyTorch and/or JAX are installed (no
Hydra, MLflow or TensorFlow): it writes JobSpecs itself and runs ``python -m fxtrack.worker``
on each, then prints a closing table. Every Result JSON lands in ``$OUT`` (or ./gpu-results).

    python bench/gpu_check.py [--frameworks torch,jax] [--steps 20] [--warmup 5]
                              [--suite seeds|llama|all] [--all] [--dry-run]

``--all`` is the prepared device check (docs/running-on-a-gpu.md), the first thing to run on a
new GPU: ResNet-50, BERT and ViT train and inference at bf16 and the 1B Llama's train and
generate, in each framework, plus every registered scenario check (``CHECKS``) this checkout has;
the table shows each figure beside its published reference (fxtrack/claims.yaml) where one exists.

Jobs (``--suite seeds``, the default): resnet50 (bf16 at 256 images, fp32 at 256), bert (bf16,
64 x 128 tokens), vit (bf16, 128 images), plus ResNet-50 at tf32 and ViT at fp32, each with
framework.compile=auto (the policy's pick for a GPU). ``--suite llama``: canonical llama (1.2B)
at bf16, training at batch 4 x 2,048 tokens and greedy generation at batch 8, prompt 128, 128
new tokens (its LM figures: tokens/s, TTFT, decode ms/token and tokens/s, KV cache); ``all``:
both. ``--dry-run`` lists the jobs with the memory pre-check's estimate and starts nothing.
MFU uses the datasheet peak of a known GPU.

Exit status 1 when any job failed, tripped its correctness guard, reported an MFU above 100%, or
did not run the expected fast path (``check``): compiled (``compile_mode`` not eager / op-by-op /
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
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fxtrack import architectures  # noqa: E402
from fxtrack.job import JobSpec, Result  # noqa: E402
from fxtrack.measure.peak import datasheet  # noqa: E402

# (model, scenario, precision, batch, scenario options)
JOBS = [("resnet50", "train", "bf16", 256, {}), ("resnet50", "train", "fp32", 256, {}),
        ("resnet50", "train", "tf32", 256, {}), ("bert", "train", "bf16", 64, {}),
        ("vit", "train", "bf16", 128, {}), ("vit", "train", "fp32", 128, {})]
# Sized for one H200 (the pre-check's floor: ~44 GiB training, ~7 GiB generating; --dry-run)
LLAMA_JOBS = [("llama", "train", "bf16", 4, {}),
              ("llama", "generate", "bf16", 8, {"prompt_len": 128, "new_tokens": 128})]
# scenario=serve (issue 32): Poisson arrivals batched by 8, the rate searched under a TPOT and an
# E2E objective; max_rate_under_slo_rps is the figure.
SERVE_JOB = ("llama", "serve", "bf16", 8,
             {"prompt_len": 128, "new_tokens": 128, "max_batch": 8, "rate": "search",
              "num_requests": 64, "resolution": 0.25, "slo": {"tpot_ms": 50.0, "e2e_ms": 20000.0}})
LLAMA_JOBS.append(SERVE_JOB)
SUITES = {"seeds": JOBS, "llama": LLAMA_JOBS, "all": JOBS + LLAMA_JOBS}
# --all: the prepared device check (docs/running-on-a-gpu.md), one ~10-minute budget on an H200:
# every family's train and inference at bf16, the 1B Llama, then each registered check.
FULL_CHECK = [(m, s, "bf16", b, {}) for m, b in (("resnet50", 256), ("bert", 64), ("vit", 128))
              for s in ("train", "inference")] + LLAMA_JOBS
# Other scenarios' checks: scenario name -> jobs, included in --all only where
# fxtrack/scenarios/<name>.py exists. A new scenario's branch adds its entry here (fit, serve).
CHECKS: dict[str, list] = {}


def register(scenario: str, jobs: list) -> None:
    """Add ``scenario``'s jobs (model, scenario, precision, batch, options) to --all."""
    CHECKS[scenario] = jobs


def available_checks() -> list:
    """The registered jobs whose scenario this checkout has."""
    return [job for name, jobs in CHECKS.items()
            if importlib.util.find_spec(f"fxtrack.scenarios.{name}") for job in jobs]


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


def run_job(framework: str, model: str, scenario: str, precision: str, batch: int,
            options: dict, steps: int, warmup: int, out: Path, timeout_s: float) -> Result:
    name = f"{framework}-{model}-{scenario}-{precision}-x1"
    spec = JobSpec(result_id=uuid.uuid4().hex, framework=framework,
                   package=f"fxtrack.frameworks.{framework}", scenario=scenario,
                   runner=f"fxtrack.scenarios.{scenario}:run",
                   arch=architectures.resolve(model).to_json(), precision=precision,
                   hardware="gpu", devices=1, compile=True, compile_request="auto", seed=0,
                   batch_size=batch, steps=steps, options=dict(options),
                   warmup_steps=warmup, result_path=str(out / f"{name}.json"), progress=False)
    spec_path = out / f"{name}.spec.json"
    spec.dump(spec_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with open(out / f"{name}.log", "w") as log:
        try:
            subprocess.run([sys.executable, "-m", "fxtrack.worker", str(spec_path)], env=env,
                           stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    path = Path(spec.result_path)
    result = Result.read(path) if path.exists() else Result(spec.result_id, error="no result")
    m = result.metrics
    sheet = datasheet(result.tags.get("device", ""), precision)
    if sheet and "flops_per_sample" in m:
        m["peak_tflops"], m["mfu"] = sheet[0], m["achieved_tflops"] / sheet[0]
        result.dump(path)
    return result


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
        elif framework == "jax" and precision in ("bf16", "fp16") and not attention.startswith("cudnn"):
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
    parser.add_argument("--suite", choices=sorted(SUITES), default="seeds",
                        help="which jobs: the seeds' models, canonical llama, or all")
    parser.add_argument("--all", action="store_true",
                        help="the prepared device check: every GPU path in one ~10-min budget")
    parser.add_argument("--dry-run", action="store_true",
                        help="list the jobs and their memory floor; run nothing")
    args = parser.parse_args()
    if args.suite == "fit":
        return fit_check(args)
    jobs = SUITES[args.suite]
    if args.all:
        jobs = FULL_CHECK + available_checks()
    refs = references()
    if args.dry_run:
        for fw in args.frameworks.split(","):
            for model, scenario, precision, batch, options in jobs:
                print(f"{fw} {model} {scenario} {precision} x{batch} {options or ''}: memory "
                      f"floor {floor_gib(model, scenario, precision, batch, options)}, "
                      f"reference {reference(refs, fw, model, scenario, precision)}")
        if args.all:
            unregistered = sorted({"fit", "serve"} - {j[1] for j in available_checks()})
            print(f"not in this checkout (no scenario): {', '.join(unregistered) or 'none'}; "
                  "2-process scaling: not part of this script yet (run fxtrack scenario=scaling)")
        return 0
    out = Path(os.environ.get("OUT") or "gpu-results")
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for fw in args.frameworks.split(","):
        if not importlib.util.find_spec(fw):
            print(f"{fw}: not installed, skipped", flush=True)
            continue
        for model, scenario, precision, batch, options in jobs:
            r = run_job(fw, model, scenario, precision, batch, options, args.steps, args.warmup,
                        out, args.timeout)
            problems = check(fw, model, precision, r, scenario)
            rows.append((fw, model, scenario, precision, batch, r, problems))
            print(f"{fw} {model} {scenario} {precision} x{batch}: {r.status} {r.error or ''}",
                  flush=True)
    header = ("framework", "model", "scenario", "prec", "batch", "samples/s", "reference",
              "p50 ms", "dev MiB", "nvml MiB", "rss MiB", "MFU", "J/sample", "guard")
    print("\n" + "  ".join(f"{h:>10}" for h in header))
    for fw, model, scenario, precision, batch, r, _ in rows:
        m = r.metrics

        def fig(k: str) -> str:
            return "-" if k not in m else (f"{m[k]:.1%}" if k == "mfu" else f"{m[k]:,.1f}")

        cells = [fw, model, scenario, precision, str(batch), fig("throughput_samples_per_s"),
                 reference(refs, fw, model, scenario, precision)] + [
            fig(k) for k in ("step_time_ms_p50", "peak_mem_device_mib",
                      "peak_mem_nvml_mib", "peak_rss_mib", "mfu", "energy_j_per_sample")]
        cells.append(r.guard if r.status == "FINISHED" else f"FAILED: {r.error}"[:40])
        print("  ".join(f"{c:>10}" for c in cells))
    lm_table(rows)
    (out / "summary.json").write_text(json.dumps(
        [{"framework": fw, "model": m, "scenario": s, "precision": p, "batch": b,
          "status": r.status, "error": r.error, "metrics": r.metrics, "tags": r.tags,
          "problems": problems}
         for fw, m, s, p, b, r, problems in rows], indent=1))
    bad = [(fw, model, precision, p) for fw, model, _, precision, _, _, ps in rows for p in ps]
    for fw, model, precision, problem in bad:
        print(f"PROBLEM {fw} {model} {precision}: {problem}", flush=True)
    if not rows:
        print("no framework installed: nothing checked", flush=True)
    return 1 if bad or not rows else 0


# ---- scenario=fit on one GPU: the largest batch of ViT-B/16 and the 1B Llama at bf16 ----------
FIT_JOBS = [("vit", "train", "bf16", 0, {}), ("llama", "train", "bf16", 0, {})]
SUITES["fit"] = FIT_JOBS  # --suite fit: fit_check below, not the plain job loop


def fit_check(args: argparse.Namespace) -> int:
    """The fit search (fxtrack.orchestrator.fit.search) with each probe a worker from run_job,
    held to the GPU's own out-of-memory error; --dry-run prints the budget and the start."""
    from fxtrack.config import fit as fit_config
    from fxtrack.orchestrator import fit

    have = fit_config.budget(None, "gpu", 1)
    out = Path(os.environ.get("OUT") or "gpu-results") / "fit"
    failed = False
    for fw in args.frameworks.split(","):
        for model, _, precision, _, _ in FIT_JOBS:
            arch = architectures.resolve(model)
            start = fit_config.start_value(arch, "batch_size", precision, None, "none", "gpu",
                                           have, 4096)
            why = fit_config.refusal(arch, "batch_size", precision, None, "none", have, 4096)
            print(f"fit {fw} {model} {precision}: budget "
                  f"{'-' if have.bytes is None else f'{have.bytes / 2**30:.1f} GiB'} "
                  f"({have.source}), start at batch {start}" + (f", refused: {why}" if why else ""),
                  flush=True)
            if args.dry_run or why or not importlib.util.find_spec(fw):
                continue

            def probe(batch: int, fw=fw, model=model, precision=precision) -> "fit.Probe":
                where = out / f"{fw}-{model}-b{batch}"
                where.mkdir(parents=True, exist_ok=True)
                r = run_job(fw, model, "train", precision, batch, {}, 3, 1, where, args.timeout)
                if r.error == "no result":  # run_job's timeout or a SIGKILL: no Result written
                    r.error = "worker killed by SIGKILL or timed out"
                verdict = fit.verdict(r, None) or "failed"
                print(f"  {fw} {model} batch {batch}: {verdict} peak {fit.peak_mib(r)} MiB",
                      flush=True)
                return fit.Probe(batch, verdict, fit.peak_mib(r),
                                 r.metrics.get("throughput_samples_per_s"))

            probes = fit.search(probe, start, 4096, 8, 0.05)
            m = fit.fit_metrics(probes, "batch_size", None, None, [])
            failed |= not m["max_batch_size"] or any(p.fit == "failed" for p in probes)
            print(f"fit {fw} {model} {precision}: largest batch {m['max_batch_size']:.0f} in "
                  f"{len(probes)} probes, {m.get('throughput_at_max_samples_per_s', 0):.1f} "
                  f"samples/s there, {m.get('memory_per_sample_mib', 0):.1f} MiB/sample",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
