"""The peak FLOP/s MFU divides by (a known GPU's datasheet figure, the same for every framework;
else each framework's own measured matmul rate): the datasheet table, the calibration cache's location, key and reader, and whether the device
computes a precision natively (``native_precision``: a bf16 run on a CPU without bf16 arithmetic
is measured as it runs, and tagged).

A known GPU uses its datasheet's dense figure, found by its whole model name. Anything else (a
CPU, an unknown GPU) uses the run's own framework's large-matmul rate there (so installing another
framework never moves a run's MFU), measured by
``fxtrack.orchestrator.calibration`` (which spawns the workers) and cached on disk keyed by CPU
model, thread count, device and precision.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Optional

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


def cache_path() -> Path:
    root = os.environ.get("FXTRACK_CACHE") or Path.home() / ".cache" / "fxtrack"
    return Path(root) / "peak_flops.json"


def cpus() -> list[int]:
    """The cores this process may run on (a calibration probe runs on the first ``threads``)."""
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


# /proc/cpuinfo flags of native arithmetic in a precision: x86 AVX-512 and AMX extensions, and
# Arm's "Features" (bf16: the ARMv8.6 BF16 instructions; asimdhp: ARMv8.2 half-precision SIMD).
NATIVE_CPU_FLAGS = {"bf16": {"avx512_bf16", "amx_bf16", "bf16"},
                    "fp16": {"avx512_fp16", "amx_fp16", "asimdhp"}}
# The CUDA compute capability from which tensor cores take the precision: fp16 from Volta
# (7.0), bf16 and tf32 from Ampere (8.0).
NATIVE_GPU_CAPABILITY = {"fp16": (7, 0), "bf16": (8, 0), "tf32": (8, 0)}


def cpu_flags(cpuinfo: str) -> set[str]:
    """The first processor's flags (x86 ``flags``, Arm ``Features``) in /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def gpu_capability() -> Optional[tuple[int, int]]:
    """CUDA compute capability of this process's first GPU (NVML, by PCI bus id as
    fxtrack.measure.nvml maps it); None without NVML or a sure mapping."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 -- no nvidia-ml-py, no driver: unknown
        return None
    try:
        from fxtrack.measure.nvml import handles

        found = handles(pynvml, [0])
        return tuple(pynvml.nvmlDeviceGetCudaComputeCapability(found[0])) if found else None
    except Exception:  # noqa: BLE001 -- an older driver without the call: unknown
        return None
    finally:
        pynvml.nvmlShutdown()


def native_precision(precision: str, kind: str, cpuinfo: Optional[str] = None,
                     capability: Optional[tuple[int, int]] = None) -> Optional[bool]:
    """Whether the device computes ``precision`` natively (False: emulated or widened, e.g. bf16
    on a CPU without AVX-512-BF16 / AMX, tf32 on any CPU, which runs it as fp32); None for fp32
    and where it cannot be told (no /proc/cpuinfo, a GPU without a known compute capability).
    ``kind``: "cpu" or "gpu"; ``cpuinfo`` / ``capability``: read from this machine when None."""
    if precision == "fp32":
        return None
    if kind == "cpu":
        if precision == "tf32":
            return False
        if cpuinfo is None:
            try:
                cpuinfo = Path("/proc/cpuinfo").read_text()
            except OSError:
                return None
        flags = cpu_flags(cpuinfo)
        return bool(flags & NATIVE_CPU_FLAGS[precision]) if flags else None
    capability = gpu_capability() if capability is None else capability
    return None if capability is None else tuple(capability) >= NATIVE_GPU_CAPABILITY[precision]


# Raised when a framework's probe changes what it measures, so cached rates are measured again
# (2: JAX's and Keras-on-JAX's bf16 probes on a CPU compute the bf16-kernel form their models
# take, 2026-12-05).
PROBES = 2


def cache_key(device: str, precision: str, threads: int) -> str:
    """Cache key: the hardware and thread count the probe ran on, not the host's name (a cluster
    shares a home directory across hosts with the same CPU; one host may run different thread
    counts), and the probes' version."""
    return f"{cpu_model()}|{threads} threads|{device}|{precision}|probes {PROBES}"


def thread_count(threads: Optional[int]) -> int:
    """The threads a calibration runs on: ``threads`` (hardware.cpu_threads) within this
    process's cores; None: all of them."""
    return min(threads or len(cpus()), len(cpus()))


def datasheet(device: str, precision: str) -> Optional[tuple[float, str]]:
    """The dense datasheet figure of a known device (by whole model name) and its source."""
    for name, pattern, figures in DATASHEET:
        if re.search(pattern, device, re.IGNORECASE):
            return (figures[precision], f"datasheet:{name}") if precision in figures else None
    return None


def cached() -> dict[str, dict[str, dict[str, Any]]]:
    """The cache: {key: {framework: entry}}; entries of an older layout are dropped."""
    path = cache_path()
    try:
        cache = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in cache.items()
            if isinstance(v, dict) and all(isinstance(e, dict) for e in v.values())}
