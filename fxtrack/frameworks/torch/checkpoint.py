"""Save / restore the full training state the PyTorch way (capability ``checkpoint``):
``torch.save`` of the model's and the optimiser's state dicts, and the RNG state (a model with
Dropout draws from it: without it the restored run's next step is another step)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from pathlib import Path

import torch

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.torch.backend import TorchBackend


def save(backend: TorchBackend, directory: Path) -> None:
    rng = {"cpu": torch.get_rng_state()}
    if backend.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(backend.device)
    torch.save({"model": backend.model.state_dict(), "optimizer": backend.opt.state_dict(),
                "rng": rng}, directory / "state.pt")


def restore(backend: TorchBackend, directory: Path) -> None:
    """Load into the live objects, in place (a compiled step keeps pointing at them)."""
    state = torch.load(directory / "state.pt", map_location=backend.device, weights_only=True)
    backend.model.load_state_dict(state["model"])
    backend.opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["cpu"].cpu())
    if "cuda" in state["rng"]:
        torch.cuda.set_rng_state(state["rng"]["cuda"].cpu(), backend.device)
