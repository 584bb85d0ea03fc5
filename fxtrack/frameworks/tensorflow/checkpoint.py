"""Save / restore the full training state the TensorFlow way (capability ``checkpoint``): a
``tf.train.Checkpoint`` of the model and optimiser."""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf


def _state(backend) -> tf.train.Checkpoint:
    # Weights, BatchNorm statistics, optimiser slots, step counter (and loss scale in fp16);
    # and the state tf.train.Checkpoint does not track through the model: Keras' seed
    # generators (a Dropout's next draw), in model.variables but not in its weights.
    weights = {id(v) for v in backend.model.weights}
    seeds = [v.value for v in backend.model.variables if id(v) not in weights]
    return tf.train.Checkpoint(model=backend.model, optimizer=backend.opt, seeds=seeds)


def save(backend, directory: Path) -> None:
    if backend._step is None:  # the optimiser's slots must exist to be saved
        with backend._place():
            backend.opt.build(backend.model.trainable_variables)
    _state(backend).write(str(directory / "state"))


def restore(backend, directory: Path) -> None:
    """Assign the saved values to the live variables, in place (a traced step keeps pointing at
    them); fails if a variable of the live state is missing from the checkpoint."""
    with backend._place():
        _state(backend).read(str(directory / "state")).assert_existing_objects_matched()
