"""Device choice, synchronisation and memory counters for PyTorch."""

from __future__ import annotations

from typing import Optional

import torch

from fxtrack.frameworks.base import PeakMemory
from fxtrack.frameworks.torch import parallel
from fxtrack.measure import matmul_probe

# tf32 computes in float32 like fp32; only the matmul precision differs (see ``configure``).
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
          "fp16": torch.float16}


def configure(precision: str, threads: int) -> dict[str, str]:
    """The fairness policy (fxtrack.policy), applied before anything is built; returns the
    settings read back from torch, as run tags.

    Matmuls: strict IEEE fp32 unless ``precision=tf32`` (torch's own default is strict too, but
    TF and JAX allow TF32 by default, so every framework sets it explicitly). cuDNN autotuning on:
    shapes are static, as XLA's autotuned convolutions assume. Threads: intra-op (OpenMP) and
    inter-op pools sized to ``threads``; the inter-op pool can be sized only once per process."""
    tf32 = precision == "tf32"
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # already sized (parallel work ran in this process): read back below
        pass
    return {"matmul_precision": "tf32" if torch.get_float32_matmul_precision() != "highest"
            else "fp32",
            "cpu_threads": str(torch.get_num_threads()),
            "cpu_interop_threads": str(torch.get_num_interop_threads())}


def select(hardware: str) -> torch.device:
    """The device for ``hardware``; under torchrun, this process's own (LOCAL_RANK)."""
    if hardware == "gpu" and not torch.cuda.is_available():
        raise RuntimeError("hardware=gpu, but PyTorch sees no CUDA device "
                           f"(torch {torch.__version__}, CUDA build: {torch.version.cuda})")
    kind = "cuda" if hardware in ("gpu", "auto") and torch.cuda.is_available() else "cpu"
    parallel.init(kind)
    device = parallel.local_device(kind)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # note: the CPU waits for every queued kernel


def peak_memory(device: torch.device) -> Optional[PeakMemory]:
    """The caching allocator's peaks: tensors (``max_memory_allocated``) and the blocks it held
    from CUDA for them (``max_memory_reserved``, its cache included); None on a CPU."""
    if device.type != "cuda":
        return None
    return PeakMemory("torch.max_memory_allocated", torch.cuda.max_memory_allocated(device),
                      "torch.max_memory_reserved", torch.cuda.max_memory_reserved(device))


def visible() -> list[str]:
    return ["cpu"] + [f"cuda:{i} {torch.cuda.get_device_name(i)}"
                      for i in range(torch.cuda.device_count())]


def tags(device: torch.device) -> dict[str, str]:
    if device.type != "cuda":
        return {"device": "cpu"}
    return {"device": torch.cuda.get_device_name(device), "cuda": str(torch.version.cuda),
            "cudnn": str(torch.backends.cudnn.version())}


def matmul_tflops(backend) -> float:
    """Capability ``calibration``: the rate of an n x n @ n x n matmul at the spec's precision on
    the backend's device, n sized to the device by ``fxtrack.measure.matmul_probe``."""
    device, dtype = backend.device, DTYPES[backend.spec.precision]

    def make(n: int):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)

        def run(reps: int) -> None:
            for _ in range(reps):
                a @ b
            sync(device)  # queued CUDA kernels; a CPU product has finished when it returns
        return run

    return matmul_probe.probe(make).tflops


def sdpa_backend(heads: int, tokens: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, kv_heads: Optional[int] = None, causal: bool = False) -> str:
    """The ``fxtrack.attention`` tag: the kernel ``F.scaled_dot_product_attention`` dispatches
    to for the model's (B, heads, T, head_dim) shape and dtype on ``device``, as torch's own
    dispatcher chooses it (``torch._fused_sdp_choice``: private, so an unknown answer is
    tagged as plain ``sdpa``)."""
    from torch.nn.attention import SDPBackend

    q = torch.zeros(1, heads, tokens, head_dim, dtype=dtype, device=device)
    kv = q if kv_heads is None else torch.zeros(1, kv_heads, tokens, head_dim, dtype=dtype,
                                                device=device)
    try:  # a decoder's call: causal, grouped K/V (the kernels that take GQA differ)
        choice = SDPBackend(torch._fused_sdp_choice(
            q, kv, kv, is_causal=causal, enable_gqa=kv_heads is not None)).name.lower()
    except Exception:  # noqa: BLE001 -- private API: absent or changed is not an error
        return "sdpa"
    return f"sdpa:{choice}"
