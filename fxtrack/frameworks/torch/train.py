"""Optimiser, loss and the training step for PyTorch (autocast, GradScaler, fused optimisers)."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from fxtrack.architectures import Arch
from fxtrack.frameworks.base import ADAMW, SGD, optimizer_choice

# Autocast dtype per precision; None: no autocast (tf32 computes in float32 like fp32).
AMP_DTYPES = {"fp32": None, "tf32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def optimizer(model: nn.Module, arch: Arch, device: torch.device,
              global_batch: int = 256) -> torch.optim.Optimizer:
    """SGD+momentum for ResNet-50, AdamW for transformers (Llama too); the fused kernels where they exist."""
    params = [p for p in model.parameters() if p.requires_grad]
    kind, lr = optimizer_choice(arch, global_batch)
    if kind == "sgd":
        make = lambda **kw: torch.optim.SGD(  # noqa: E731
            params, lr=lr, momentum=SGD["momentum"], weight_decay=SGD["weight_decay"], **kw)
    else:
        make = lambda **kw: torch.optim.AdamW(  # noqa: E731
            params, lr=lr, betas=(ADAMW["b1"], ADAMW["b2"]), eps=ADAMW["eps"],
            weight_decay=ADAMW["weight_decay"], **kw)
    if any(hasattr(p, "to_local") for p in params):  # FSDP shards (DTensors): no fused kernel
        return make(foreach=True)
    try:
        return make(fused=True)
    except (RuntimeError, TypeError, ValueError):  # no fused kernel for this device/optimiser
        return make()


def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    if "images" in batch:
        return F.cross_entropy(model(batch["images"]).float(), batch["labels"])
    logits = model(model_input(batch)).float()  # (B, T, vocab)
    if "mlm_labels" not in batch:  # a decoder LM: mean next-token cross-entropy, every position
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
    ce = F.cross_entropy(logits.flatten(0, 1), batch["mlm_labels"].flatten(), reduction="none")
    w = batch["mlm_weights"].flatten()
    return (ce * w).sum() / w.sum()


def forward_loss(model: nn.Module, precision: str,
                 device: torch.device) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """batch -> loss: the forward under autocast and the fp32 loss, as one function, so that
    ``torch.compile`` captures both (the upcast and the cross-entropy over BERT's (B, T, vocab)
    logits fuse with the model's last matmul, as XLA fuses them for TF and JAX)."""
    amp = AMP_DTYPES[precision]

    def fn(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            return loss_fn(model, batch)

    return fn


def compile_loss(fn: Callable[[dict[str, torch.Tensor]], torch.Tensor], mode: str = "default",
                 backend: Any = "inductor") -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """``torch.compile`` of ``forward_loss``'s function: model and loss in one graph (plus its
    backward through AOTAutograd). ``mode``: framework.compile_mode (default | reduce-overhead =
    CUDA graphs | max-autotune)."""
    return torch.compile(fn, mode=None if mode == "default" else mode, backend=backend)


def make_step(loss: Callable[[dict[str, torch.Tensor]], torch.Tensor], opt: torch.optim.Optimizer,
              precision: str, device: torch.device,
              sync: Callable[[], None]) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """One training step on a device batch: ``loss`` (``forward_loss``, compiled or not),
    (scaled) backward, optimiser step, sync."""
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")

    def step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        value = loss(batch)
        scaler.scale(value).backward()
        scaler.step(opt)
        scaler.update()
        sync()
        return value.detach()

    return step


def model_input(batch: Any) -> Any:
    """The model's inputs in a resident batch: fxtrack's own batch's images or token ids, or
    the inputs of a builder's (inputs, targets) pair (model=custom)."""
    if isinstance(batch, tuple):
        return batch[0]
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
