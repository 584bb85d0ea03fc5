"""Data parallelism for PyTorch: DistributedDataParallel over the processes torchrun started
(NCCL between GPUs, gloo between CPU processes)."""

from __future__ import annotations

import os
import warnings
from typing import Iterable, Optional

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


def wrap(model: nn.Module, device: torch.device, mode: str = "ddp",
         blocks: Optional[Iterable[nn.Module]] = None) -> nn.Module:
    """DDP when there is more than one process: gradients all-reduced during backward.
    ``mode="fsdp"``: FSDP2 instead (``shard`` over ``blocks``, by default ``model.blocks``).
    Build the optimiser after this."""
    if world_size() == 1:
        return model  # nothing to shard or all-reduce over
    if mode == "fsdp":
        return shard(model, model.blocks if blocks is None else blocks)
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def shard(model: nn.Module, blocks: Iterable[nn.Module]) -> nn.Module:
    """parallel=fsdp: FSDP2's ``fully_shard`` on each block (transformer block / ResNet
    bottleneck; a user's model: its policy's blocks, innermost first), then on the root
    (embeddings, stem, head; all of a model with no blocks): each rank keeps 1/world of every
    parameter, gradient and optimiser state (dim-0 shards, DTensors); a block's full weights are
    all-gathered just before its forward and backward and freed after, gradients
    reduce-scattered. Works over gloo on CPU (torch 2.13) as over NCCL."""
    from torch.distributed.fsdp import fully_shard

    for p in model.parameters():  # FSDP2 shards dim 0 of contiguous tensors only: conv weights
        p.data = p.data.contiguous()  # go back from channels-last (the input may stay NHWC)
    # Each rank keeps its own slice of its own tensors: rank 0's weights everywhere first, as
    # DDP broadcasts them (a user's builder seeded per rank initialises each rank differently).
    for t in [*model.parameters(), *model.buffers()]:
        dist.broadcast(t.data, src=0)
    for block in blocks:
        fully_shard(block)
    fully_shard(model)
    # BERT's tied decoder (F.linear over (B, T, hidden)) returns a view, and FSDP2 warns on every
    # forward that an in-place op on it would skip the backward hook. The loss (train.loss_fn)
    # only upcasts, flattens and reads the logits, out of place; the warning would be noise.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    return model


def local_param_count(model: nn.Module) -> int:
    """Parameter elements this rank holds: its shards under FSDP, everything otherwise."""
    return sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
               for p in model.parameters())


def local_state_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """Bytes of parameters, buffers and optimiser state this rank holds (its shards under FSDP:
    DTensors count their local part)."""
    tensors = [*model.parameters(), *model.buffers(),
               *(v for state in opt.state.values() for v in state.values() if torch.is_tensor(v))]
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local)


def reduce_max(value: float, device: torch.device) -> float:
    if world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def mean_over_ranks(value: torch.Tensor) -> torch.Tensor:
    """``value`` averaged over every rank (a tensor on this rank's device); itself on one."""
    if world_size() == 1:
        return value
    total = value.detach().clone()
    dist.all_reduce(total)  # gloo has no AVG: the sum, then / world
    return total / world_size()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
