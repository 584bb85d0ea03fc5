"""The synthetic batch, on the device in PyTorch's layout (NCHW, int64 class indices)."""

from __future__ import annotations

import torch

from fxtrack.architectures import Arch
from fxtrack.synthetic import make_batch


def device_batch(arch: Arch, batch_size: int, seed: int, device: torch.device,
                 channels_last: bool) -> dict[str, torch.Tensor]:
    batch = {k: torch.from_numpy(v) for k, v in make_batch(arch, batch_size, seed).items()}
    if "images" in batch:
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        batch["images"] = batch["images"].permute(0, 3, 1, 2).contiguous(memory_format=fmt)
    for key in ("labels", "input_ids", "mlm_labels"):
        if key in batch:
            batch[key] = batch[key].long()
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}
