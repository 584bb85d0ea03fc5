"""model=custom in TensorFlow: the user's ``keras.Model`` with NumPy arrays and its loss,
trained by fxtrack's step (dtype policy, loss scaling, tf.function / XLA, tf.distribute) as its
own models are; FLOPs from ``tf.compat.v1.profiler`` on the frozen graph of one forward +
backward (TF 2.x exposes no XLA cost analysis from Python)."""

from __future__ import annotations

from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from fxtrack.frameworks import keras_train
from fxtrack.frameworks import user_builder as ub
from fxtrack.frameworks.tensorflow import train
from fxtrack.frameworks.tf_graph import graph_flops


def abstract_param_count(backend: Any) -> int:
    """The memory pre-check's count: a shape-only Keras build (``keras_train``'s)."""
    return keras_train.abstract_param_count(backend)


def build(backend: Any, batch_size: int) -> None:
    spec, arch, fw = backend.spec, backend.arch, backend.framework
    keras.utils.set_random_seed(spec.seed)
    with backend.placement():
        with train.precision_policy(spec.precision):  # layers read it when constructed
            model, inputs, targets, user_loss = ub.call(arch, fw, batch_size, spec.seed)
            backend.seq_len = ub.sequence_length(arch, fw, inputs)
        ub.expect(isinstance(model, keras.Model), arch, fw, "a model", "a keras.Model", model)
        for x in ub.leaves(inputs) + ub.leaves(targets):
            ub.expect(isinstance(x, np.ndarray), arch, fw, "an input or target",
                      "NumPy arrays", x)
        backend.model = model
        backend.opt = train.optimizer(arch, spec.precision,
                                      batch_size * backend.strategy.num_replicas_in_sync)
    with tf.device(backend.device):
        to_tf = lambda x: tf.identity(tf.constant(x))  # noqa: E731  (onto the device)
        batch = (ub.tree_map(to_tf, inputs), ub.tree_map(to_tf, targets))
    backend.loss_of = loss_of(user_loss)
    check_scalar(backend, batch)
    backend.one_batch = batch
    if backend.strategy.num_replicas_in_sync > 1:  # each replica trains on the same batch
        batch = backend.strategy.experimental_distribute_values_from_function(lambda _: batch)
    backend.batch, backend.batch_size = batch, batch_size
    with backend.placement():
        backend.use_step(train.make_step(model, backend.opt, backend.strategy, spec.compile,
                                         loss=backend.loss_of))


def loss_of(user_loss: Callable[[Any, Any], Any]) -> Callable[..., tf.Tensor]:
    """``train.make_step``'s loss for a user's model: the forward on the inputs, its floating
    outputs upcast to float32 and the loss computed there, as for fxtrack's own models."""
    def upcast(x: Any) -> Any:
        return tf.cast(x, tf.float32) if x.dtype.is_floating else x

    def fn(model: keras.Model, batch: tuple, training: bool = True) -> tf.Tensor:
        inputs, targets = batch
        outputs = tf.nest.map_structure(upcast,
                                        model(ub.keras_inputs(inputs), training=training))
        return tf.cast(user_loss(outputs, targets), tf.float32)

    return fn


def check_scalar(backend: Any, batch: tuple) -> None:
    """One forward before any timed work: the loss must be a scalar."""
    with tf.device(backend.device):
        value = backend.loss_of(backend.model, batch, training=False)
    ub.expect(value.shape.rank == 0, backend.arch, backend.framework, "a loss",
              f"loss_fn(outputs, targets) -> a scalar (shape ()), got shape "
              f"{tuple(value.shape)}", value)


def train_flops_per_sample(backend: Any) -> tuple[float, str]:
    """The profiler's float-op count of one forward + backward (the optimiser update left out,
    as torch's and JAX's counts leave it out), per sample."""
    model, variables = backend.model, backend.model.trainable_variables

    def grads(batch: tuple) -> tuple:
        with tf.GradientTape() as tape:
            value = backend.loss_of(model, batch, training=True)
        return value, tape.gradient(value, variables)

    flops = graph_flops(grads, backend.one_batch, backend.device)
    return flops / backend.batch_size, "tf.compat.v1.profiler"


def prepare_inference(backend: Any) -> Callable[[], None]:
    """scenario=inference: the Keras model in inference mode as one tf.function (XLA when
    compiled) on the first replica's inputs."""
    inputs = ub.keras_inputs(backend.one_batch[0])
    with tf.device(backend.device):
        forward = tf.function(lambda: backend.model(inputs, training=False),
                              jit_compile=backend.spec.compile)
    return backend.synced(forward)


def forward_flops_per_sample(backend: Any) -> tuple[float, str]:
    """The profiler's float-op count of one inference-mode forward, per sample."""
    def forward(batch: tuple) -> Any:
        return backend.model(ub.keras_inputs(batch[0]), training=False)

    flops = graph_flops(forward, backend.one_batch, backend.device)
    return flops / backend.batch_size, "tf.compat.v1.profiler"


def export(backend: Any, directory: Any) -> Callable[[], None]:
    """scenario=checkpoint's serving export (capability ``user_serving_export``): the user's
    Keras model as a SavedModel through Keras' ``model.export`` (one ``serve`` endpoint in
    inference mode, any batch size, its inputs in the structure the model is called with),
    loaded back with ``tf.saved_model.load`` as a server would; a synced forward of the loaded
    endpoint on the first replica's inputs."""
    inputs = ub.keras_inputs(backend.one_batch[0])
    signature = tf.nest.map_structure(
        lambda x: tf.TensorSpec((None, *x.shape[1:]), x.dtype), inputs)
    backend.model.export(str(directory), format="tf_saved_model", input_signature=[signature],
                         verbose=False)
    backend.served = tf.saved_model.load(str(directory))  # kept: its functions read its variables
    served = backend.served
    return backend.synced(lambda: served.serve(inputs))


def export_error(backend: Any) -> float:
    """The largest relative error of the loaded SavedModel's floating outputs against the live
    model's (inference mode, the same inputs): ``max|a - b| / max|b|`` over every output."""
    inputs = ub.keras_inputs(backend.one_batch[0])
    with tf.device(backend.device):
        live = tf.nest.flatten(backend.model(inputs, training=False))
        served = tf.nest.flatten(backend.served.serve(inputs))
    worst = 0.0
    for a, b in zip(served, live):
        if b.dtype.is_floating:
            a, b = tf.cast(a, tf.float32), tf.cast(b, tf.float32)
            scale = max(float(tf.reduce_max(tf.abs(b))), 1e-12)
            worst = max(worst, float(tf.reduce_max(tf.abs(a - b))) / scale)
    return worst
