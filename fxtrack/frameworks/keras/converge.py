"""scenario=converge for Keras 3: ``train_on_batch`` on host batches, the scheduled rate
assigned to the optimiser's learning-rate variable before each step, and ``predict_on_batch``
(inference mode) for the held-out logits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fxtrack.frameworks import keras_models
from fxtrack.frameworks.keras import data

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.keras.backend import KerasBackend


def _same_start(backend) -> None:
    """Before the first step: the start every framework shares (fxtrack.frameworks.initial)."""
    if not getattr(backend, "same_start", False):
        keras_models.load_initial(backend.model, backend.spec.seed)
        backend.same_start = True


def weights(backend) -> dict[str, Any]:
    """The trained weights under PyTorch's names and layout (``initial.save`` writes them)."""
    return keras_models.saved_weights(backend.model)


def load_weights(backend, path: str) -> None:
    from fxtrack.frameworks import initial

    keras_models.load_initial(backend.model, backend.spec.seed, initial.loaded(path))
    backend.same_start = True  # the loaded weights are the start: train_on_host keeps them


def train_on_host(backend: KerasBackend, batch: dict, lr: float) -> float:
    _same_start(backend)
    backend.opt.learning_rate.assign(lr)
    x, y, weights = data.fit_form(batch)  # BERT's masked positions as sample weights
    return backend.model.train_on_batch(x, y, sample_weight=weights, return_dict=False)


def outputs(backend: KerasBackend, batch: dict) -> Any:
    x = batch["images"] if "images" in batch else batch["input_ids"]
    return np.asarray(backend.model.predict_on_batch(x), dtype=np.float32)


def exported_input(backend, batch: dict) -> np.ndarray:
    return np.ascontiguousarray(batch["images"] if "images" in batch else batch["input_ids"])
