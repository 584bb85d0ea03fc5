"""scenario=inference (and the checkpoint scenario's live model) for PyTorch: the built model in
eval mode, compiled as its training step was, forward-only on the resident batch."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable

import torch

from fxtrack.frameworks.torch import FRAMEWORK, devices, train

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.torch.backend import TorchBackend


def prepare(backend: TorchBackend) -> Callable[[], None]:
    backend.model.eval()  # BatchNorm running statistics
    runnable = backend.model
    if backend.spec.compile:
        mode = FRAMEWORK.setting(backend.spec, "compile_mode")
        runnable = torch.compile(backend.model, mode=None if mode == "default" else mode)
    return train.make_inference_step(runnable, backend.batch, backend.spec.precision,
                                     backend.device, functools.partial(devices.sync, backend.device))
