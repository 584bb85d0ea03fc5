"""Save / restore the full training state and export for serving, the TensorFlow way: a
``tf.train.Checkpoint`` of the model and optimiser, and a SavedModel (Keras' ``model.export``)
loaded back with ``tf.saved_model.load``."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import keras
import tensorflow as tf


def _state(model: keras.Model, opt: keras.optimizers.Optimizer) -> tf.train.Checkpoint:
    # Weights, BatchNorm statistics, optimiser slots, step counter (and loss scale in fp16).
    return tf.train.Checkpoint(model=model, optimizer=opt)


def save(model: keras.Model, opt: keras.optimizers.Optimizer, directory: Path) -> None:
    """Write the state (the optimiser's slots must exist: build it first)."""
    _state(model, opt).write(str(directory / "state"))


def restore(model: keras.Model, opt: keras.optimizers.Optimizer, directory: Path) -> None:
    """Assign the saved values to the live variables, in place (a traced step keeps pointing at
    them); fails if a variable of the live state is missing from the checkpoint."""
    _state(model, opt).read(str(directory / "state")).assert_existing_objects_matched()


def export(model: keras.Model, example: tf.Tensor, directory: Path) -> Path:
    """A SavedModel with one ``serve`` endpoint (inference mode, any batch size); its path."""
    spec = tf.TensorSpec((None, *example.shape[1:]), example.dtype, name="inputs")
    model.export(str(directory), format="tf_saved_model", input_signature=[spec], verbose=False)
    return directory


def load_exported(path: Path) -> Callable[[tf.Tensor], tf.Tensor]:
    """The serving-side view: the SavedModel loaded back from disk, as a callable."""
    served = tf.saved_model.load(str(path))
    # A bound reference keeps the loaded object (and the variables its function reads) alive.
    return lambda x: served.serve(x)
