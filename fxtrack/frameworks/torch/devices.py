"""Device choice, synchronisation and memory counters for PyTorch."""

from __future__ import annotations

from typing import Optional

import time

import torch

from fxtrack.frameworks.torch import parallel

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


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


def peak_memory_bytes(device: torch.device) -> Optional[int]:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def visible() -> list[str]:
    return ["cpu"] + [f"cuda:{i} {torch.cuda.get_device_name(i)}"
                      for i in range(torch.cuda.device_count())]


def tags(device: torch.device) -> dict[str, str]:
    if device.type != "cuda":
        return {"device": "cpu"}
    return {"device": torch.cuda.get_device_name(device), "cuda": str(torch.version.cuda),
            "cudnn": str(torch.backends.cudnn.version())}


def matmul_tflops(device: torch.device, precision: str) -> float:
    """Best-of-three rate of an n x n @ n x n matmul (n = 8192 on a GPU, 2048 on a CPU)."""
    n, reps = (8192, 20) if device.type == "cuda" else (2048, 4)
    a = torch.randn(n, n, device=device, dtype=DTYPES[precision])
    b = torch.randn(n, n, device=device, dtype=DTYPES[precision])
    a @ b  # warm-up: kernel selection, oneDNN/cuBLAS initialisation
    sync(device)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 * reps / best / 1e12
