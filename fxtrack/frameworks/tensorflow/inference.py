"""scenario=inference (and the checkpoint scenario's live model) for TensorFlow: the Keras model
in inference mode as one tf.function (XLA when compiled), on the first replica's batch."""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from fxtrack.frameworks.tensorflow import train


def prepare(backend) -> Callable[[], None]:
    with tf.device(backend.device):
        forward = train.make_inference_step(backend.model, backend._one_batch(),
                                            backend.spec.compile)
    return backend._synced(forward)
