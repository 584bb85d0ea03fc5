"""The one peak FLOP/s per device and precision that MFU divides by, the same for every framework.

A known GPU uses its datasheet's dense figure. Anything else (a CPU, an unknown GPU) uses the best
large-matmul rate that any installed framework reaches there, measured once per host, device and
precision, each framework in its own worker, and cached on disk. Every framework's own rate is
logged too (``framework_matmul_tflops``), so a framework that leaves the hardware unused shows it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Optional

# Dense tensor-core TFLOP/s (bf16 / fp16) and non-tensor fp32, from NVIDIA's datasheets:
# H100 SXM and H200 (H100/H200 datasheets, 2024), H100 PCIe, A100 (A100 datasheet, 2021),
# L4 (L4 datasheet), V100 SXM2 (V100 datasheet; no bf16). Checked in order: first match wins.
DATASHEET = [
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 51.0}),
    ("H200", {"bf16": 989.5, "fp16": 989.5, "fp32": 67.0}),
    ("H100", {"bf16": 989.5, "fp16": 989.5, "fp32": 67.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
]
FRAMEWORKS = ("torch", "tensorflow", "jax")
_CONF_DIR = Path(__file__).resolve().parents[2] / "conf" / "framework"


def cache_path() -> Path:
    root = os.environ.get("FXTRACK_CACHE") or Path.home() / ".cache" / "fxtrack"
    return Path(root) / "peak_flops.json"


def _key(device: str, precision: str) -> str:
    return f"{platform.node()}|{device}|{precision}"


def datasheet(device: str, precision: str) -> Optional[tuple[float, str]]:
    for name, figures in DATASHEET:
        if name in device and precision in figures:
            return figures[precision], f"datasheet:{name}"
    return None


_FAILED = object()  # the measurement failed: not cached, tried again next time


def probe(what: str, framework: str, python: Optional[str], precision: str = "fp32",
          hardware: str = "auto", timeout_s: float = 600) -> Optional[dict]:
    """Ask ``framework``'s worker (``python -m fxtrack.worker --describe|--matmul``) under
    ``python``; its JSON answer, or None when the worker failed."""
    from omegaconf import OmegaConf  # the orchestrator's dependency, not the worker's

    backend = OmegaConf.load(_CONF_DIR / f"{framework}.yaml")["backend"]
    cmd = [python or sys.executable, "-m", "fxtrack.worker", f"--{what}", framework, backend,
           precision, hardware]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(_CONF_DIR.parents[1]), os.environ.get("PYTHONPATH")])))
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return json.loads(lines[-1]) if out.returncode == 0 and lines else None


def _measure(framework: str, python: Optional[str], precision: str, hardware: str):
    """TFLOP/s, None if the framework is not installed for ``python``, or _FAILED."""
    answer = probe("matmul", framework, python, precision, hardware)
    if answer is None:
        return _FAILED
    return answer.get("tflops") if answer["installed"] else None


def calibrate(device: str, precision: str, hardware: str, pythons: dict[str, str],
              refresh: bool = False) -> dict[str, Optional[float]]:
    """Every framework's matmul rate on ``device`` at ``precision`` (None: not installed),
    from the cache, measuring the missing ones (all of them when ``refresh``)."""
    path = cache_path()
    rates = {} if refresh else dict(cached().get(_key(device, precision), {}))
    missing = [fw for fw in FRAMEWORKS if fw not in rates]
    if missing:
        print(f"[fxtrack] calibrating peak FLOP/s on {device} at {precision} with "
              f"{', '.join(missing)} (once; cached in {path})", file=sys.stderr, flush=True)
        measured = {fw: _measure(fw, pythons.get(fw), precision, hardware) for fw in missing}
        rates.update({fw: r for fw, r in measured.items() if r is not _FAILED})
        cache = cached()  # read again: merge what concurrent processes wrote meanwhile
        cache[_key(device, precision)] = rates
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        tmp.replace(path)
    return rates


def cached() -> dict[str, dict[str, Optional[float]]]:
    path = cache_path()
    return json.loads(path.read_text()) if path.exists() else {}


def mfu_metrics(framework: str, device: str, precision: str, hardware: str, devices: int,
                achieved_tflops: float, pythons: dict[str, str]) -> tuple[dict[str, float], str]:
    """``peak_tflops``, ``framework_matmul_tflops`` and ``mfu``, and the peak's source."""
    rates = calibrate(device, precision, hardware, pythons)
    if not datasheet(device, precision) and achieved_tflops / devices > max(
            (r for r in rates.values() if r), default=float("inf")):
        # A model outran the "peak": the calibration ran on a busy machine. Measure again once.
        print("[fxtrack] the cached peak is below this run's rate; calibrating again",
              file=sys.stderr, flush=True)
        rates = calibrate(device, precision, hardware, pythons, refresh=True)
    metrics: dict[str, float] = {}
    if rates.get(framework):
        metrics["framework_matmul_tflops"] = rates[framework]
    sheet = datasheet(device, precision)
    measured = [r for r in rates.values() if r]
    if sheet:
        peak, source = sheet
    elif measured:
        best = max(FRAMEWORKS, key=lambda fw: rates.get(fw) or 0.0)
        peak, source = rates[best], f"measured:{best}"
    else:
        return metrics, ""
    metrics["peak_tflops"] = peak
    metrics["mfu"] = achieved_tflops / (devices * peak)
    return metrics, source
