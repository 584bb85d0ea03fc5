"""The one peak FLOP/s per device and precision that MFU divides by, the same for every framework.

A known GPU uses its datasheet's dense figure, found by its whole model name. Anything else (a
CPU, an unknown GPU) uses the best large-matmul rate that any installed framework reaches there,
each framework probed in its own worker, best of ``TRIALS`` probes, and cached on disk keyed by
CPU model, thread count, device and precision. A calibration taken while other processes used the
cores (``fxtrack.measure.load``) serves the run that asked for it but is never cached. Every
framework's own rate is logged too (``framework_matmul_tflops``), so a framework that leaves the
hardware unused shows it.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from fxtrack.measure.load import LoadSampler, is_contended

# Dense (no structured sparsity) TFLOP/s of one device: fp32 = non-tensor-core IEEE fp32 (vector),
# tf32 / bf16 / fp16 = tensor (matrix) cores. Datasheets quote tensor figures "with sparsity"; those
# are halved here. A GPU without TF32 (V100) runs tf32 requests as fp32: its tf32 entry is the
# fp32 figure; without bf16 it has no bf16 entry (MFU then comes from a measured peak).
# (entry name, whole-name pattern (case-insensitive), figures). First match wins: specific first.
_H100_SXM = {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}
_NVL = {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}
DATASHEET: list[tuple[str, str, dict[str, float]]] = [
    # NVIDIA H100 Tensor Core GPU datasheet (2024): SXM / PCIe / NVL columns.
    ("H100 NVL", r"\bH100\s+NVL\b", _NVL),
    ("H100 PCIe", r"\bH100\b.*\bPCIe\b",
     {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0}),
    ("H100 SXM", r"\bH100\b", _H100_SXM),  # torch/JAX/NVML: "NVIDIA H100 80GB HBM3"
    # NVIDIA H200 Tensor Core GPU datasheet (2024): H200 NVL / H200 SXM columns.
    ("H200 NVL", r"\bH200\s+NVL\b", _NVL),
    ("H200 SXM", r"\bH200\b", _H100_SXM),  # "NVIDIA H200"; same compute as H100 SXM
    ("GH200", r"\bGH200\b", _H100_SXM),  # NVIDIA GH200 Grace Hopper datasheet: the H100 SXM figures
    # NVIDIA HGX B200 datasheet (2024): 8-GPU totals (TF32 18, FP16/BF16 36 PFLOPS sparse, FP32
    # 600 TFLOPS) / 8 GPUs, sparsity halved.
    ("B200", r"\bB200\b", {"fp32": 75.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0}),
    # NVIDIA A100 Tensor Core GPU datasheet (2021): same compute for SXM4 and PCIe, 40/80 GB.
    ("A100", r"\bA100\b", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    # NVIDIA L40S datasheet (2023): TF32 183 | 366*, BF16/FP16 362.05 | 733*.
    ("L40S", r"\bL40S\b", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05}),
    # NVIDIA L40 datasheet (2022): TF32 90.5 | 181*, BF16/FP16 181.05 | 362.1*.
    ("L40", r"\bL40\b", {"fp32": 90.5, "tf32": 90.5, "bf16": 181.05, "fp16": 181.05}),
    # NVIDIA L4 datasheet (2023): TF32 120*, BF16/FP16 242* (sparse).
    ("L4", r"\bL4\b", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    # NVIDIA V100 datasheet (2020): SXM2 / PCIe columns; Volta has neither TF32 nor bf16.
    ("V100 SXM2", r"\bV100-SXM2\b", {"fp32": 15.7, "tf32": 15.7, "fp16": 125.0}),
    ("V100 PCIe", r"\bV100-PCIE\b", {"fp32": 14.0, "tf32": 14.0, "fp16": 112.0}),
    # AMD Instinct MI300X datasheet (2023): FP32 vector 163.4, TF32 653.7, FP16/BF16 1307.4 (dense).
    ("MI300X", r"\bMI300X\b", {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4}),
]
FRAMEWORKS = ("torch", "tensorflow", "jax")
TRIALS = 3  # probes per framework; the best counts (a probe can only lose to other work, not gain)
_FAILED = object()  # the measurement failed: not cached, tried again next time
# Entries this process measured but did not cache (contended, or "not installed" for an
# interpreter that is not the framework's): every run of one sweep still divides by one peak.
_UNCACHED: dict[str, dict[str, dict[str, Any]]] = {}


def _conf_dir() -> Path:
    """Where the framework configs live: fxtrack's config directory (a checkout's conf/, or
    the package fxtrack.conf in a wheel), found the one way the CLI finds it."""
    from fxtrack.paths import CONF_DIR

    return CONF_DIR / "framework"


def framework_backend(framework: str) -> str:
    """``package`` (the framework's declaration) from conf/framework/<framework>.yaml: the
    worker probe's third word."""
    from omegaconf import OmegaConf  # the orchestrator's dependency, not the worker's

    return OmegaConf.load(_conf_dir() / f"{framework}.yaml")["package"]


def cache_path() -> Path:
    root = os.environ.get("FXTRACK_CACHE") or Path.home() / ".cache" / "fxtrack"
    return Path(root) / "peak_flops.json"


def _cpus() -> list[int]:
    from fxtrack.policy import allowed_cpus

    return allowed_cpus()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _key(device: str, precision: str, threads: int) -> str:
    """Cache key: the hardware and thread count the probe ran on, not the host's name (a cluster
    shares a home directory across hosts with the same CPU; one host may run different thread
    counts)."""
    return f"{cpu_model()}|{threads} threads|{device}|{precision}"


def _threads(threads: Optional[int]) -> int:
    return min(threads or len(_cpus()), len(_cpus()))


def datasheet(device: str, precision: str) -> Optional[tuple[float, str]]:
    """The dense datasheet figure of a known device (by whole model name) and its source."""
    for name, pattern, figures in DATASHEET:
        if re.search(pattern, device, re.IGNORECASE):
            return (figures[precision], f"datasheet:{name}") if precision in figures else None
    return None


def probe(what: str, framework: str, python: Optional[str], precision: str = "fp32",
          hardware: str = "auto", timeout_s: float = 600,
          threads: Optional[int] = None) -> Optional[dict]:
    """Ask ``framework``'s worker (``python -m fxtrack.worker --describe|--matmul``) under
    ``python``; its JSON answer, or None when the worker failed. ``threads``: the worker may run
    on only the first ``threads`` of this process's cores (its affinity, which the worker's
    thread pools follow)."""
    cmd = [python or sys.executable, "-m", "fxtrack.worker", f"--{what}", framework,
           framework_backend(framework), precision, hardware]
    from fxtrack.environment import worker_environment  # a worker's: no secrets in it

    env = worker_environment(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")]))
    cores = _cpus()[:threads] if threads and threads < len(_cpus()) else None
    preexec = None
    if cores and hasattr(os, "sched_setaffinity"):
        preexec = lambda: os.sched_setaffinity(0, cores)  # noqa: E731 - runs in the child
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env,
                             preexec_fn=preexec)
    except (OSError, subprocess.TimeoutExpired, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return json.loads(lines[-1]) if out.returncode == 0 and lines else None


def _trial(framework: str, python: Optional[str], precision: str, hardware: str,
           threads: int) -> tuple[Optional[dict], Optional[float]]:
    """One matmul probe: (the worker's answer or None, other processes' share of the probe's
    cores meanwhile, 0..1, None where /proc cannot be read)."""
    with LoadSampler(threads) as load:
        answer = probe("matmul", framework, python, precision, hardware, threads=threads)
    return answer, load.other_cpu_frac


def _measure(framework: str, python: Optional[str], precision: str, hardware: str,
             threads: int, cpu: bool):
    """Best of TRIALS probes as a cache entry ``{"tflops", "date", "other_cpu_frac",
    "contended"}`` (tflops None: not installed for ``python``), or _FAILED."""
    best, fracs, quiet = None, [], False
    for _ in range(TRIALS):
        answer, frac = _trial(framework, python, precision, hardware, threads)
        if answer is None:
            continue
        if not answer["installed"]:
            return {"tflops": None, "date": _now(), "other_cpu_frac": frac, "contended": False,
                    "python": python or sys.executable}
        best = max(best or 0.0, answer.get("tflops") or 0.0)
        fracs.append(frac)
        # Only a CPU probe competes with other processes for its arithmetic.
        quiet = quiet or not (cpu and is_contended(frac))
    if not best:
        return _FAILED
    return {"tflops": best, "date": _now(), "contended": not quiet,
            "other_cpu_frac": max((f for f in fracs if f is not None), default=None)}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def calibrate(device: str, precision: str, hardware: str, pythons: dict[str, Optional[str]],
              refresh: bool = False, threads: Optional[int] = None) -> dict[str, dict[str, Any]]:
    """Every framework's matmul entry on ``device`` at ``precision`` (``tflops`` None: not
    installed), from the cache, measuring the missing ones (all of them when ``refresh``).

    ``pythons``: each framework's configured interpreter (None: this one). A framework absent from
    it is probed with this interpreter; if that says "not installed", the answer serves this
    process only: the framework may live in a venv of its own that this run was not told about.
    A cached "not installed" is kept with the interpreter that said it, and asked again when a
    run configures another one.
    """
    threads = _threads(threads)
    key, path = _key(device, precision, threads), cache_path()
    if refresh:
        _UNCACHED.pop(key, None)
    entries = {} if refresh else {**_UNCACHED.get(key, {}), **cached().get(key, {})}
    for fw, python in pythons.items():  # "not installed" holds only for the interpreter asked
        if fw in entries and entries[fw]["tflops"] is None and \
                entries[fw].get("python") != (python or sys.executable):
            del entries[fw]
    missing = [fw for fw in FRAMEWORKS if fw not in entries]
    if not missing:
        return entries
    print(f"[fxtrack] calibrating peak FLOP/s on {device} at {precision} ({threads} threads) with "
          f"{', '.join(missing)}, best of {TRIALS} (cached in {path})", file=sys.stderr, flush=True)
    cpu = hardware == "cpu" or device == "cpu"
    measured = {fw: _measure(fw, pythons.get(fw), precision, hardware, threads, cpu)
                for fw in missing}
    measured = {fw: e for fw, e in measured.items() if e is not _FAILED}
    entries.update(measured)
    keep = {fw: e for fw, e in measured.items()
            if not e["contended"] and (e["tflops"] is not None or fw in pythons)}
    _UNCACHED.setdefault(key, {}).update({fw: e for fw, e in measured.items() if fw not in keep})
    busy = [fw for fw, e in measured.items() if e["contended"]]
    if busy:
        print(f"[fxtrack] other processes used the cores while calibrating {', '.join(busy)} "
              "(every trial contended): used by this process's runs, not cached",
              file=sys.stderr, flush=True)
    if keep:
        cache = cached()  # read again: merge what concurrent processes wrote meanwhile
        cache[key] = dict(cache.get(key, {}) if not refresh else {}, **keep)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        tmp.replace(path)
    return entries


def cached() -> dict[str, dict[str, dict[str, Any]]]:
    """The cache: {key: {framework: entry}}; entries of an older layout are dropped."""
    path = cache_path()
    try:
        cache = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in cache.items()
            if isinstance(v, dict) and all(isinstance(e, dict) for e in v.values())}


def _rate(entries: dict[str, dict[str, Any]], fw: str) -> float:
    return (entries.get(fw) or {}).get("tflops") or 0.0


def mfu_metrics(framework: str, device: str, precision: str, hardware: str, devices: int,
                achieved_tflops: float, pythons: dict[str, Optional[str]],
                threads: Optional[int] = None) -> tuple[dict[str, float], dict[str, str]]:
    """(``peak_tflops``, ``framework_matmul_tflops``, ``mfu``) and the tags that qualify them:
    ``peak_tflops_source``, ``peak_calibrated`` (the measured peak's UTC date), ``mfu_over_1``
    (an MFU above 1 is impossible: the peak or the FLOP count is wrong; never logged silently)."""
    entries = calibrate(device, precision, hardware, pythons, threads=threads)
    sheet = datasheet(device, precision)
    best_rate = max((_rate(entries, fw) for fw in FRAMEWORKS), default=0.0)
    if not sheet and best_rate and achieved_tflops / devices > best_rate:
        # A model outran the "peak": the calibration ran on a busy machine. Measure again once.
        print("[fxtrack] the cached peak is below this run's rate; calibrating again",
              file=sys.stderr, flush=True)
        entries = calibrate(device, precision, hardware, pythons, refresh=True, threads=threads)
    metrics: dict[str, float] = {}
    tags: dict[str, str] = {}
    if _rate(entries, framework):
        metrics["framework_matmul_tflops"] = _rate(entries, framework)
    best = max(FRAMEWORKS, key=lambda fw: _rate(entries, fw))
    if sheet:
        peak, tags["peak_tflops_source"] = sheet
    elif _rate(entries, best):
        peak, tags["peak_tflops_source"] = _rate(entries, best), f"measured:{best}"
        entry = entries[best]
        busy = " (contended, not cached)" if entry["contended"] else ""
        tags["peak_calibrated"] = entry["date"] + busy
    else:
        return metrics, tags
    metrics["peak_tflops"] = peak
    metrics["mfu"] = achieved_tflops / (devices * peak)
    if metrics["mfu"] > 1.0:
        tags["mfu_over_1"] = "true"
    return metrics, tags
