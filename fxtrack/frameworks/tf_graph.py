"""TensorFlow's float-op count of a function's graph, shared by framework=tensorflow and by Keras
on its TensorFlow backend (each framework's package stands alone, so neither owns it). Imports
``tensorflow``: only a worker that already runs TensorFlow imports this module."""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf


def graph_flops(fn: Callable[[Any], Any], batch: Any, device: str) -> int:
    """``tf.compat.v1.profiler``'s float-op count of ``fn(batch)``'s graph, traced on ``device``
    with its variables frozen to constants (TF 2.x offers XLA's cost analysis to no Python
    caller)."""
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    with tf.device(device):
        concrete = tf.function(fn).get_concrete_function(batch)
        try:
            graph = convert_variables_to_constants_v2(concrete).graph
        except ValueError:
            # A graph that assigns a variable (Dropout's seed generator, BatchNorm's moving
            # statistics) cannot be frozen; the profiler reads the same shapes off the live graph.
            graph = concrete.graph
    profiler, logger = tf.compat.v1.profiler, tf.get_logger()
    options = (profiler.ProfileOptionBuilder(profiler.ProfileOptionBuilder.float_operation())
               .with_empty_output().build())
    level = logger.level
    logger.setLevel("ERROR")  # the v1 profiler's deprecation warnings, one per op kind
    try:
        return profiler.profile(graph=graph, options=options).total_float_ops
    finally:
        logger.setLevel(level)
