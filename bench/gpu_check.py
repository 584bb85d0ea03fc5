"""GPU validation at canonical size, runnable where only PyTorch and/or JAX are installed (no
Hydra, MLflow or TensorFlow): it writes JobSpecs itself and runs ``python -m fxtrack.worker``
on each, then prints a closing table. Every Result JSON lands in ``$OUT`` (or ./gpu-results).

    python bench/gpu_check.py [--frameworks torch,jax] [--steps 20] [--warmup 5]
                              [--suite seeds|llama|all] [--dry-run]

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
    est = memory.estimate(architectures.resolve(model), scenario, precision, batch, **options)
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
    parser.add_argument("--dry-run", action="store_true",
                        help="list the jobs and their memory floor; run nothing")
    args = parser.parse_args()
    jobs = SUITES[args.suite]
    if args.dry_run:
        for fw in args.frameworks.split(","):
            for model, scenario, precision, batch, options in jobs:
                print(f"{fw} {model} {scenario} {precision} x{batch} {options or ''}: memory "
                      f"floor {floor_gib(model, scenario, precision, batch, options)}")
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
    header = ("framework", "model", "prec", "batch", "samples/s", "p50 ms", "dev MiB", "nvml MiB",
              "rss MiB", "MFU", "J/sample", "guard")
    print("\n" + "  ".join(f"{h:>10}" for h in header))
    for fw, model, _, precision, batch, r, _ in rows:
        m = r.metrics
        cells = [fw, model, precision, str(batch)] + [
            "-" if k not in m else (f"{m[k]:.1%}" if k == "mfu" else f"{m[k]:,.1f}")
            for k in ("throughput_samples_per_s", "step_time_ms_p50", "peak_mem_device_mib",
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


if __name__ == "__main__":
    sys.exit(main())
