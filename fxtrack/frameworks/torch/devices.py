"""Device choice, synchronisation and memory counters for PyTorch."""

from __future__ import annotations

from typing import Optional

import torch


def select(hardware: str) -> torch.device:
    if hardware == "gpu" and not torch.cuda.is_available():
        raise RuntimeError("hardware=gpu, but PyTorch sees no CUDA device "
                           f"(torch {torch.__version__}, CUDA build: {torch.version.cuda})")
    if hardware in ("gpu", "auto") and torch.cuda.is_available():
        return torch.device("cuda", 0)
    return torch.device("cpu")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # note: the CPU waits for every queued kernel


def peak_memory_bytes(device: torch.device) -> Optional[int]:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def tags(device: torch.device) -> dict[str, str]:
    if device.type != "cuda":
        return {"device": "cpu"}
    return {"device": torch.cuda.get_device_name(device), "cuda": str(torch.version.cuda),
            "cudnn": str(torch.backends.cudnn.version())}
