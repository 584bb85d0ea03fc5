"""scenario=converge for TensorFlow: the built step on host batches (the tf.function takes
them as inputs), the scheduled rate assigned to the optimiser's learning-rate variable before
each step, and the model's logits in inference mode."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from fxtrack.frameworks import keras_models

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.tensorflow.backend import TensorFlowBackend


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


def train_on_host(backend: TensorFlowBackend, batch: dict, lr: float) -> np.ndarray:
    _same_start(backend)
    backend.opt.learning_rate.assign(lr)
    with tf.device(backend.device):
        on_device = {k: tf.constant(v) for k, v in batch.items()}
    return backend.train_on(on_device)


def outputs(backend: TensorFlowBackend, batch: dict) -> Any:
    x = batch["images"] if "images" in batch else batch["input_ids"]
    with tf.device(backend.device):
        logits = backend.model(tf.constant(x), training=False)
    return np.asarray(logits, dtype=np.float32)


def exported_input(backend, batch: dict) -> np.ndarray:
    return np.ascontiguousarray(batch["images"] if "images" in batch else batch["input_ids"])
