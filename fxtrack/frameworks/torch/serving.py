"""Serving export for PyTorch (capability ``serving_export``, the checkpoint scenario):
``torch.export`` to a ``.pt2`` program, loaded back as a server would and run on the resident
batch. Deployment exports (ONNX, int8) are ``deployment.py``'s."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from fxtrack.frameworks.torch import devices, train

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.torch.backend import TorchBackend


def save_program(model: nn.Module, example: torch.Tensor, directory: Path) -> Path:
    """``torch.export`` the model in eval mode and save the program; returns its path."""
    model.eval()
    program = torch.export.export(model, (example,))
    path = directory / "model.pt2"
    torch.export.save(program, path)
    return path


def load_program(path: Path) -> Callable[[torch.Tensor], torch.Tensor]:
    """The serving-side view: the program loaded back from disk, as a callable module."""
    return torch.export.load(path).module()


def export(backend: TorchBackend, directory: Path) -> Callable[[], None]:
    """Export into ``directory``, load it back, and return a synced forward step of the loaded
    program on the resident batch."""
    path = save_program(backend.model, train.model_input(backend.batch), directory)
    served = load_program(path)
    return train.make_inference_step(served, backend.batch, backend.spec.precision,
                                     backend.device, functools.partial(devices.sync, backend.device))
