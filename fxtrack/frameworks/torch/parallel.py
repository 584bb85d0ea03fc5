"""Data parallelism for PyTorch: DistributedDataParallel over the processes torchrun started
(NCCL between GPUs, gloo between CPU processes)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def init(device_type: str) -> None:
    """Join the process group torchrun set up (MASTER_ADDR/PORT, RANK, WORLD_SIZE)."""
    if world_size() > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")


def local_device(device_type: str) -> torch.device:
    if device_type == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def wrap(model: nn.Module, device: torch.device) -> nn.Module:
    """DDP when there is more than one process: gradients all-reduced during backward."""
    if world_size() == 1:
        return model
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def reduce_max(value: float, device: torch.device) -> float:
    if world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
