"""Optimiser, loss and the training step for PyTorch (autocast, GradScaler, fused optimisers)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fxtrack.architectures import Arch
from fxtrack.frameworks.base import ADAMW, SGD, sgd_lr

AMP_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def optimizer(model: nn.Module, arch: Arch, device: torch.device,
              global_batch: int = 256) -> torch.optim.Optimizer:
    """SGD+momentum for ResNet-50, AdamW for transformers; the fused kernels where they exist."""
    params = [p for p in model.parameters() if p.requires_grad]
    if arch.family == "resnet":
        make = lambda **kw: torch.optim.SGD(  # noqa: E731
            params, lr=sgd_lr(global_batch), momentum=SGD["momentum"],
            weight_decay=SGD["weight_decay"], **kw)
    else:
        make = lambda **kw: torch.optim.AdamW(  # noqa: E731
            params, lr=ADAMW["lr"], betas=(ADAMW["b1"], ADAMW["b2"]), eps=ADAMW["eps"],
            weight_decay=ADAMW["weight_decay"], **kw)
    try:
        return make(fused=True)
    except (RuntimeError, TypeError, ValueError):  # no fused kernel for this device/optimiser
        return make()


def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    if "images" in batch:
        return F.cross_entropy(model(batch["images"]).float(), batch["labels"])
    logits = model(model_input(batch)).float()  # (B, T, vocab)
    ce = F.cross_entropy(logits.flatten(0, 1), batch["mlm_labels"].flatten(), reduction="none")
    w = batch["mlm_weights"].flatten()
    return (ce * w).sum() / w.sum()


def make_step(model: nn.Module, opt: torch.optim.Optimizer, precision: str, device: torch.device,
              sync: Callable[[], None]) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """One training step on a device batch: forward under autocast, (scaled) backward,
    optimiser step, sync."""
    amp = AMP_DTYPES[precision]
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")

    def step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            loss = loss_fn(model, batch)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sync()
        return loss.detach()

    return step


def model_input(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return batch["images"] if "images" in batch else batch["input_ids"]


def make_inference_step(model: nn.Module, batch: dict[str, torch.Tensor], precision: str,
                        device: torch.device, sync: Callable[[], None]) -> Callable[[], None]:
    """Forward only: no autograd state (inference_mode), autocast as in training, then sync."""
    amp = AMP_DTYPES[precision]
    x = model_input(batch)

    def step() -> None:
        with torch.inference_mode(), torch.autocast(device.type, dtype=amp or torch.float32,
                                                    enabled=amp is not None):
            model(x)
        sync()

    return step
