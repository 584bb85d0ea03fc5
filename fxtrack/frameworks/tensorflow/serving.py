"""Serving export for TensorFlow (capability ``serving_export``, the checkpoint scenario): a
SavedModel (Keras' ``model.export``) loaded back with ``tf.saved_model.load`` and run on the
first replica's batch. Deployment exports (TFLite, ONNX) are ``deployment.py``'s."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

import keras
import tensorflow as tf

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.tensorflow.backend import TensorFlowBackend


def save_model(model: keras.Model, example: tf.Tensor, directory: Path) -> Path:
    """A SavedModel with one ``serve`` endpoint (inference mode, any batch size); its path."""
    spec = tf.TensorSpec((None, *example.shape[1:]), example.dtype, name="inputs")
    model.export(str(directory), format="tf_saved_model", input_signature=[spec], verbose=False)
    return directory


def load_model(path: Path) -> Callable[[tf.Tensor], tf.Tensor]:
    """The serving-side view: the SavedModel loaded back from disk, as a callable."""
    served = tf.saved_model.load(str(path))
    # A bound reference keeps the loaded object (and the variables its function reads) alive.
    return lambda x: served.serve(x)


def export(backend: TensorFlowBackend, directory: Path) -> Callable[[], None]:
    """Export into ``directory``, load it back, and return a synced forward step of the loaded
    model on the resident batch."""
    batch = backend.replica_batch()
    x = batch["images"] if "images" in batch else batch["input_ids"]
    served = load_model(save_model(backend.model, x, directory))
    return backend.synced(lambda: served(x))
