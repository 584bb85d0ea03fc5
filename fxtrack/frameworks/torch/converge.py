"""scenario=converge for PyTorch: the built step on host batches of real data, the learning
rate set per step (the schedule is the scenario's, one formula for every framework), and the
model's logits on held-out batches. Also the ``converge_devices`` capability: under torchrun each
rank trains on its slice of the global batch, from the shared start (sharded under FSDP)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fxtrack.frameworks import initial
from fxtrack.frameworks.torch import data, parallel, train

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.torch.backend import TorchBackend


def _on_device(backend: TorchBackend, batch: dict) -> dict[str, torch.Tensor]:
    host = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
    if "images" in host:
        host["images"] = host["images"].permute(0, 3, 1, 2)  # NHWC -> NCHW
    return data.to_device(host, backend.device, backend.channels_last)


def train_on_host(backend: TorchBackend, batch: dict, lr: float) -> torch.Tensor:
    """One step on the global host batch: under torchrun each rank takes its contiguous
    1/world of the rows (DDP averages the gradients, FSDP reduce-scatters them: the global
    batch's mean either way); the loss returned is the mean over ranks, the global batch's."""
    if not getattr(backend, "same_start", False):  # before the first step
        same_start(backend)
        backend.same_start = True
    for group in backend.opt.param_groups:
        group["lr"] = lr
    backend.model.train()
    world, rank = parallel.world_size(), parallel.rank()
    if world > 1:
        n = len(next(iter(batch.values()))) // world  # the config check: world divides it
        batch = {k: v[rank * n:(rank + 1) * n] for k, v in batch.items()}
    return parallel.mean_over_ranks(backend.train_on(_on_device(backend, batch)))


def outputs(backend: TorchBackend, batch: dict) -> Any:
    backend.model.eval()
    amp = train.AMP_DTYPES[backend.spec.precision]
    # no_grad, not inference_mode: FSDP2's all-gathered parameters are made outside it
    with torch.no_grad(), torch.autocast(backend.device.type, dtype=amp or torch.float32,
                                                enabled=amp is not None):
        logits = backend.model(train.model_input(_on_device(backend, batch)))
    return logits.float().cpu().numpy()


def same_start(backend: TorchBackend, value: Any = initial.value) -> None:
    """Every parameter from ``fxtrack.frameworks.initial`` (the start every framework shares),
    or from ``value`` (``initial.loaded``: saved weights); under parallel=fsdp each rank's
    shard of it (a DTensor's global shape is the full parameter's)."""
    with torch.no_grad():
        for name, param in backend.model.named_parameters():
            full = torch.from_numpy(np.ascontiguousarray(
                value(name, tuple(param.shape), backend.spec.seed)))
            if hasattr(param, "device_mesh"):  # FSDP2's DTensor: this rank's dim-0 shard
                from torch.distributed.tensor import distribute_tensor

                full = distribute_tensor(full.to(param.device), param.device_mesh,
                                         param.placements)
            param.copy_(full)


def weights(backend: TorchBackend) -> dict[str, Any]:
    """The trained parameters by name, on the host (``initial.save`` writes them); FSDP's
    shards gathered (a collective: every rank calls it)."""
    return {name: (param.full_tensor() if hasattr(param, "full_tensor") else param)
            .detach().float().cpu().numpy() for name, param in backend.model.named_parameters()}


def load_weights(backend: TorchBackend, path: str) -> None:
    same_start(backend, initial.loaded(path))
    backend.same_start = True  # the loaded weights are the start: train_on_host keeps them


def exported_input(backend: TorchBackend, batch: dict) -> np.ndarray:
    x = batch["images"].transpose(0, 3, 1, 2) if "images" in batch else batch["input_ids"]
    return np.ascontiguousarray(x)  # NHWC -> NCHW, as _on_device feeds the model
