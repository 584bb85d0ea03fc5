"""Device choice, memory counters and device tags for JAX."""

from __future__ import annotations

import functools
import os
from typing import Any, Optional

import jax
import jax.numpy as jnp

from fxtrack.frameworks.base import PeakMemory
from fxtrack.frameworks import xla_bf16
from fxtrack.measure import matmul_probe

# tf32 computes in float32 like fp32; only the matmul precision differs (see ``configure``).
DTYPES = {"fp32": jnp.float32, "tf32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}


def configure(precision: str) -> dict[str, str]:
    """The fairness policy (fxtrack.policy), applied before anything is traced; returns the
    settings read back from JAX, as run tags.

    Matmuls: ``jax_default_matmul_precision`` "highest" (IEEE fp32) unless ``precision=tf32``
    ("tensorfloat32"); JAX's own default lets XLA use TF32 on Ampere and later GPUs. Threads:
    XLA:CPU sizes its pools from the process's CPU affinity, which the worker narrowed to
    ``hardware.cpu_threads`` cores before JAX was imported (``fxtrack.policy``), so the
    read-back is the affinity."""
    jax.config.update("jax_default_matmul_precision",
                      "tensorfloat32" if precision == "tf32" else "highest")
    value = jax.config.jax_default_matmul_precision
    return {"matmul_precision": "fp32" if value in ("highest", "float32") else "tf32",
            "cpu_threads": str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                               else os.cpu_count())}


def attention_implementation(shape: tuple[int, ...], dtype: Any, kv_heads: Optional[int] = None,
                             causal: bool = False) -> str:
    """``"cudnn"`` or ``"xla"``: the ``jax.nn.dot_product_attention`` implementation for q of
    ``shape`` (B, T, heads, head_dim) and ``dtype`` on the default backend, with K and V of
    ``kv_heads`` heads (grouped-query attention; default: as many as q) and a causal mask if
    ``causal``. cuDNN's fused (flash) attention on a GPU with bf16 / fp16 where it accepts the
    shape forward and backward (JAX checks when it traces, so a trial trace of the
    gradient on abstract values decides); XLA's
    composite elsewhere (CPU, fp32, unsupported shapes). The same answer is the
    ``fxtrack.attention`` tag."""
    return _attention_implementation(tuple(shape), jnp.dtype(dtype).name, jax.default_backend(),
                                     kv_heads or shape[2], causal)


def attention_tag(shape: tuple[int, ...], dtype: Any, kv_heads: Optional[int] = None,
                  causal: bool = False) -> str:
    """The ``fxtrack.attention`` tag: ``attention_implementation``'s answer, and where a GPU run at
    bf16 / fp16 falls back to XLA, cuDNN's own reason (``xla: cudnn refused: ...``), so a run
    that missed the fused path says why (ViT's 197 tokens, jax 0.11.2 on an H200)."""
    impl = attention_implementation(shape, dtype, kv_heads, causal)
    why = _cudnn_refusal(tuple(shape), jnp.dtype(dtype).name, jax.default_backend(),
                         kv_heads or shape[2], causal)
    return f"xla: cudnn refused: {why}" if impl == "xla" and why else impl


@functools.lru_cache(maxsize=None)
def _attention_implementation(shape: tuple[int, ...], dtype: str, backend: str, kv_heads: int,
                              causal: bool) -> str:
    if backend != "gpu" or dtype not in ("bfloat16", "float16"):
        return "xla"
    return "xla" if _cudnn_refusal(shape, dtype, backend, kv_heads, causal) else "cudnn"


@functools.lru_cache(maxsize=None)
def _cudnn_refusal(shape: tuple[int, ...], dtype: str, backend: str, kv_heads: int,
                   causal: bool) -> Optional[str]:
    """Why cuDNN's fused attention refuses this shape forward or backward (None: it takes it, or
    the run is not a GPU one at half precision, where XLA is the choice, not a refusal)."""
    if backend != "gpu" or dtype not in ("bfloat16", "float16"):
        return None
    q = jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))
    kv = jax.ShapeDtypeStruct((*shape[:2], kv_heads, shape[3]), jnp.dtype(dtype))

    def attend(a: jax.Array, b: jax.Array) -> jax.Array:
        return jax.nn.dot_product_attention(a, b, b, is_causal=causal, implementation="cudnn")

    try:  # the backward too: its rule refuses shapes the forward takes (seq 17, jax 0.11.2 H200)
        jax.eval_shape(jax.grad(lambda a, b: attend(a, b).astype(jnp.float32).sum(),
                                argnums=(0, 1)), q, kv)
    except Exception as e:  # noqa: BLE001 -- any refusal (shape, dtype, cuDNN version) means XLA
        return (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
    return None


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


def peak_memory(device: jax.Device) -> Optional[PeakMemory]:
    """The allocator's peaks (``memory_stats()``): buffers in use (``peak_bytes_in_use``) and,
    where the allocator reports it, the pool it grew for them (``peak_pool_bytes``); None where
    the device keeps no statistics (CPU)."""
    return PeakMemory.from_jax_stats(device.memory_stats())


def visible() -> list[str]:
    """Every device of every backend JAX has here, e.g. ``["cpu:0", "gpu:0 NVIDIA H200"]``."""
    out = [f"cpu:{d.id}" for d in jax.local_devices(backend="cpu")]
    return out + [f"gpu:{d.id} {d.device_kind}" for d in _gpus()]


def matmul_tflops(backend) -> float:
    """Capability ``calibration``: the rate of a jitted n x n @ n x n matmul at the spec's
    precision on the backend's device, n sized to the device by ``fxtrack.measure.matmul_probe``
    (its untimed first run of each size is the compilation for that shape). The product is the
    one fxtrack's models compute (``xla_bf16.PROBE_PRODUCT``: the bf16-kernel form at bf16 on a CPU):
    XLA's own bf16 dot there is upcast to float32, 5x slower, and a peak taken from it put the
    bf16 ViT-B/16 at 116% MFU (docs/results/mfu-2026-12-05.md)."""
    device, dtype = backend.device, DTYPES[backend.spec.precision]
    matmul = xla_bf16.PROBE_PRODUCT

    def make(n: int):
        ka, kb = jax.random.split(jax.random.key(0))
        a, b = (jax.device_put(jax.random.normal(k, (n, n), dtype), device) for k in (ka, kb))

        def run(reps: int) -> None:
            for _ in range(reps):
                out = matmul(a, b)  # dispatched asynchronously, in order on the device
            out.block_until_ready()
        return run

    return matmul_probe.probe(make).tflops


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
