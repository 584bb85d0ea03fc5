"""The synthetic batch, on the device in PyTorch's layout (NCHW, int64 class indices)."""

from __future__ import annotations

import torch

from fxtrack.architectures import Arch
from fxtrack.data.synthetic import make_batch


def device_batch(arch: Arch, batch_size: int, seed: int, device: torch.device,
                 channels_last: bool) -> dict[str, torch.Tensor]:
    batch = {k: torch.from_numpy(v) for k, v in make_batch(arch, batch_size, seed).items()}
    if "images" in batch:
        batch["images"] = batch["images"].permute(0, 3, 1, 2)  # NHWC -> NCHW
    return to_device(batch, device, channels_last)


def to_device(batch: dict[str, torch.Tensor], device: torch.device,
              channels_last: bool) -> dict[str, torch.Tensor]:
    """A host batch (images NCHW) onto the device: int64 indices, the model's memory format."""
    out = {}
    for key, value in batch.items():
        value = value.to(device, non_blocking=True)
        if key in ("labels", "input_ids", "mlm_labels"):
            value = value.long()
        if key == "images":
            fmt = torch.channels_last if channels_last else torch.contiguous_format
            value = value.contiguous(memory_format=fmt)
        out[key] = value
    return out
