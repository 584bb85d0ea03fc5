"""Save / restore the full training state and export for serving, the PyTorch way:
``torch.save`` of the state dicts, and ``torch.export`` to a ``.pt2`` program."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch import nn


def save(model: nn.Module, opt: torch.optim.Optimizer, directory: Path) -> None:
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, directory / "state.pt")


def restore(model: nn.Module, opt: torch.optim.Optimizer, directory: Path,
            device: torch.device) -> None:
    """Load into the live objects, in place (a compiled step keeps pointing at them)."""
    state = torch.load(directory / "state.pt", map_location=device, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])


def export(model: nn.Module, example: torch.Tensor, directory: Path) -> Path:
    """``torch.export`` the model in eval mode and save the program; returns its path."""
    model.eval()
    program = torch.export.export(model, (example,))
    path = directory / "model.pt2"
    torch.export.save(program, path)
    return path


def load_exported(path: Path) -> Callable[[torch.Tensor], torch.Tensor]:
    """The serving-side view: the program loaded back from disk, as a callable module."""
    return torch.export.load(path).module()
