"""Save / restore the full training state the PyTorch way (capability ``checkpoint``):
``torch.save`` of the model's and the optimiser's state dicts."""

from __future__ import annotations

from pathlib import Path

import torch


def save(backend, directory: Path) -> None:
    torch.save({"model": backend.model.state_dict(), "optimizer": backend.opt.state_dict()},
               directory / "state.pt")


def restore(backend, directory: Path) -> None:
    """Load into the live objects, in place (a compiled step keeps pointing at them)."""
    state = torch.load(directory / "state.pt", map_location=backend.device, weights_only=True)
    backend.model.load_state_dict(state["model"])
    backend.opt.load_state_dict(state["optimizer"])
