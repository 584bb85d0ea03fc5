"""Device choice, memory counters and device tags for JAX."""

from __future__ import annotations

import time
from typing import Optional

import jax
import jax.numpy as jnp

DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}


def _gpus() -> list[jax.Device]:
    """This process's GPUs (none when jaxlib has no GPU backend)."""
    try:
        return jax.local_devices(backend="gpu")
    except RuntimeError:  # no CUDA/ROCm backend in this jaxlib, or no device behind it
        return []


def select(hardware: str) -> jax.Device:
    """The device for ``hardware`` (auto | cpu | gpu); ``gpu`` without one raises."""
    if hardware in ("gpu", "auto"):
        gpus = _gpus()
        if gpus:
            return gpus[0]
        if hardware == "gpu":
            raise RuntimeError(
                f"hardware=gpu, but JAX sees no GPU (jax {jax.__version__}, backends: "
                f"{jax.default_backend()}); install a CUDA build, e.g. pip install 'jax[cuda12]'")
    return jax.local_devices(backend="cpu")[0]  # this process's: under jax.distributed,
    # jax.devices() lists every process's devices, and device 0 is node 0's


def kind(device: jax.Device) -> str:
    """``"cpu"`` or ``"gpu"``, the Backend's ``device_kind``."""
    return "cpu" if device.platform == "cpu" else "gpu"


def peak_memory_bytes(device: jax.Device) -> Optional[int]:
    """The allocator's peak (``memory_stats()['peak_bytes_in_use']``); None where the device
    keeps no statistics (CPU)."""
    stats = device.memory_stats()
    peak = (stats or {}).get("peak_bytes_in_use")
    return None if peak is None else int(peak)


def visible() -> list[str]:
    """Every device of every backend JAX has here, e.g. ``["cpu:0", "gpu:0 NVIDIA H200"]``."""
    out = [f"cpu:{d.id}" for d in jax.local_devices(backend="cpu")]
    return out + [f"gpu:{d.id} {d.device_kind}" for d in _gpus()]


def matmul_tflops(device: jax.Device, precision: str) -> float:
    """Best-of-three rate of a jitted n x n @ n x n matmul (n = 8192 on a GPU, 2048 on a CPU),
    the method of the PyTorch backend's ``devices.matmul_tflops``."""
    n, reps = (8192, 20) if device.platform != "cpu" else (2048, 4)
    ka, kb = jax.random.split(jax.random.key(0))
    a, b = (jax.device_put(jax.random.normal(k, (n, n), DTYPES[precision]), device)
            for k in (ka, kb))
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()  # warm-up: compilation, cuBLAS / Eigen initialisation
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            out = matmul(a, b)  # dispatched asynchronously, in order on the device
        out.block_until_ready()  # note: the host waits for all ``reps`` products here
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 * reps / best / 1e12


def tags(device: jax.Device) -> dict[str, str]:
    """Device name (and CUDA / cuDNN versions on a GPU) for the run's tags."""
    if device.platform == "cpu":
        return {"device": "cpu"}
    out = {"device": device.device_kind, "jax_backend": device.platform}
    try:  # CUDA and cuDNN versions, where the CUDA plugin is installed
        from jax._src.lib import cuda_versions

        out["cuda"] = str(cuda_versions.cuda_runtime_get_version())
        out["cudnn"] = str(cuda_versions.cudnn_get_version())
    except Exception:  # noqa: BLE001 -- a private module: absent or changed is not an error
        pass
    return out
