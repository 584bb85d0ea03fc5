"""scenario=inference (and the checkpoint scenario's live model) for TensorFlow: the Keras model
in inference mode as one tf.function (XLA when compiled), on the first replica's batch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import tensorflow as tf

from fxtrack.frameworks.tensorflow import train

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.tensorflow.backend import TensorFlowBackend


def prepare(backend: TensorFlowBackend) -> Callable[[], None]:
    with tf.device(backend.device):
        forward = train.make_inference_step(backend.model, backend.replica_batch(),
                                            backend.spec.compile)
    return backend.synced(forward)
