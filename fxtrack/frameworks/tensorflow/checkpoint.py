"""Save / restore the full training state the TensorFlow way (capability ``checkpoint``): a
``tf.train.Checkpoint`` of the model and optimiser."""

from __future__ import annotations

from typing import TYPE_CHECKING
from pathlib import Path

import tensorflow as tf

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.tensorflow.backend import TensorFlowBackend


def _state(backend: TensorFlowBackend) -> tf.train.Checkpoint:
    # Weights, BatchNorm statistics, optimiser slots, step counter (and loss scale in fp16);
    # and the state tf.train.Checkpoint does not track through the model: Keras' seed
    # generators (a Dropout's next draw), in model.variables but not in its weights.
    weights = {id(v) for v in backend.model.weights}
    seeds = [v.value for v in backend.model.variables if id(v) not in weights]
    return tf.train.Checkpoint(model=backend.model, optimizer=backend.opt, seeds=seeds)


def save(backend: TensorFlowBackend, directory: Path) -> None:
    if not backend.step_made:  # the optimiser's slots must exist to be saved
        with backend.placement():
            backend.opt.build(backend.model.trainable_variables)
    _state(backend).write(str(directory / "state"))


def restore(backend: TensorFlowBackend, directory: Path) -> None:
    """Assign the saved values to the live variables, in place (a traced step keeps pointing at
    them); fails if a variable of the live state is missing from the checkpoint."""
    with backend.placement():
        _state(backend).read(str(directory / "state")).assert_existing_objects_matched()
