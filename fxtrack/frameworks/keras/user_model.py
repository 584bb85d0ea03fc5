"""model=custom on Keras 3's own path: the user's ``keras.Model`` (``model.keras``, the builder
framework=tensorflow reads) with NumPy arrays and its loss, compiled and trained by
``model.compile`` + ``train_on_batch`` as fxtrack's own models are on this backend; FLOPs from
the counter of the framework under Keras (XLA's cost analysis on JAX, FlopCounterMode on torch,
TensorFlow's profiler on TensorFlow)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import keras
import numpy as np

from fxtrack.frameworks import keras_train
from fxtrack.frameworks import user_builder as ub
from fxtrack.frameworks.keras import devices, train

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.keras.backend import KerasBackend

SOURCES = {"jax": "jax.cost_analysis", "torch": "torch.utils.flop_counter",
           "tensorflow": "tf.compat.v1.profiler"}


class UserLoss(keras.losses.Loss):
    """The user's ``loss_fn(outputs, targets)`` as the loss Keras calls ``(y_true, y_pred)``:
    floating outputs upcast to float32 first, as fxtrack's logits are, the targets left in
    their own dtype (``Loss.__call__`` would cast them to float32, integer labels included)."""

    def __init__(self, user_loss: Callable[[Any, Any], Any]) -> None:
        super().__init__(name="user_loss")
        self.user_loss = user_loss

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        outputs = keras.tree.map_structure(_upcast, y_pred)
        return keras.ops.cast(self.user_loss(outputs, y_true), "float32")


def _upcast(x: Any) -> Any:
    return keras.ops.cast(x, "float32") if keras.backend.is_float_dtype(x.dtype) else x


def abstract_param_count(backend: KerasBackend) -> int:
    """The memory pre-check's count: a shape-only Keras build (``keras_train``'s)."""
    return keras_train.abstract_param_count(backend)


def build(backend: KerasBackend, batch_size: int) -> None:
    spec, arch, fw = backend.spec, backend.arch, backend.framework
    keras.utils.set_random_seed(spec.seed)
    with keras_train.precision_policy(spec.precision):  # layers read it when constructed
        model, inputs, targets, user_loss = ub.call(arch, fw, batch_size, spec.seed)
        backend.seq_len = ub.sequence_length(arch, fw, inputs)
    ub.expect(isinstance(model, keras.Model), arch, fw, "a model", "a keras.Model", model)
    for x in ub.leaves(inputs) + ub.leaves(targets):
        ub.expect(isinstance(x, np.ndarray), arch, fw, "an input or target", "NumPy arrays", x)
    # compile() maps one loss over each output and its target: the user's loss, which takes
    # the whole (outputs, targets), fits only one of each
    ub.expect(isinstance(targets, np.ndarray), arch, fw, "targets",
              "one NumPy array of targets (Keras' compile applies a loss per output)", targets)
    to_device = keras.ops.convert_to_tensor  # onto the backend's default device, once
    backend.x = ub.keras_inputs(ub.tree_map(to_device, inputs))
    backend.y, backend.sample_weight = to_device(targets), None
    backend.model, backend.loss_fn = model, UserLoss(user_loss)
    check_outputs(backend)
    backend.opt = keras_train.optimizer(arch, spec.precision, batch_size)
    backend.compiled = train.compile_model(model, backend.opt, backend.loss_fn,
                                           spec.compile_request)
    backend.batch_size = batch_size


def check_outputs(backend: KerasBackend) -> None:
    """One untimed forward before any timed work: one output, and a scalar loss."""
    arch, fw = backend.arch, backend.framework
    outputs = backend.model(backend.x, training=False)
    ub.expect(not keras.tree.is_nested(outputs), arch, fw, "outputs",
              "a model with one output (Keras' compile applies a loss per output)", outputs)
    shape = tuple(backend.loss_fn(backend.y, outputs).shape)
    ub.expect(shape == (), arch, fw, "a loss",
              f"loss_fn(outputs, targets) -> a scalar (shape ()), got shape {shape}", shape)


def prepare_inference(backend: KerasBackend) -> Callable[[], None]:
    """scenario=inference: Keras' own ``predict_on_batch`` on the resident inputs, as for
    fxtrack's models (fxtrack.frameworks.keras.inference): outputs copied to the host."""
    model, x = backend.model, backend.x

    def step() -> None:
        model.predict_on_batch(x)

    return step


def train_flops_per_sample(backend: KerasBackend) -> tuple[float, str]:
    """The backend's counter over one forward + backward (no optimiser update, as the native
    frameworks' counts), per sample."""
    name = devices.backend_name()
    return COUNTERS[name](backend, True) / backend.batch_size, SOURCES[name]


def forward_flops_per_sample(backend: KerasBackend) -> tuple[float, str]:
    """The backend's counter over one inference-mode forward, per sample."""
    name = devices.backend_name()
    return COUNTERS[name](backend, False) / backend.batch_size, SOURCES[name]


def _jax_flops(backend: KerasBackend, training: bool) -> float:
    """XLA's count of the jitted forward (and gradient), run statelessly: nothing updated."""
    import jax

    model = backend.model
    trainable = [v.value for v in model.trainable_variables]
    others = [v.value for v in model.non_trainable_variables]

    def forward(trainable: list, others: list, x: Any) -> Any:
        return model.stateless_call(trainable, others, x, training=training)[0]

    if training:
        def loss(trainable: list, others: list, x: Any, y: Any) -> Any:
            return backend.loss_fn(y, forward(trainable, others, x))

        fn, args = jax.grad(loss), (trainable, others, backend.x, backend.y)
    else:
        fn, args = forward, (trainable, others, backend.x)
    cost: Any = jax.jit(fn).lower(*args).compile().cost_analysis()
    if isinstance(cost, (list, tuple)):  # older JAX: one dict per computation
        cost = cost[0]
    return float(cost["flops"])


def _torch_flops(backend: KerasBackend, training: bool) -> float:
    """FlopCounterMode over the eager forward (and backward); the gradients cleared after."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model, counter = backend.model, FlopCounterMode(display=False)
    if training:
        with counter:
            backend.loss_fn(backend.y, model(backend.x, training=True)).backward()
        for v in model.trainable_variables:
            v.value.grad = None
    else:
        with counter, torch.no_grad():
            model(backend.x, training=False)
    return float(counter.get_total_flops())


def _tf_flops(backend: KerasBackend, training: bool) -> float:
    """TensorFlow's profiler on the frozen graph, as framework=tensorflow counts."""
    import tensorflow as tf

    from fxtrack.frameworks.tf_graph import graph_flops

    model, variables = backend.model, backend.model.trainable_variables

    def grads(batch: tuple) -> Any:
        x, y = batch
        with tf.GradientTape() as tape:
            value = backend.loss_fn(y, model(x, training=True))
        return value, tape.gradient(value, variables)

    def forward(batch: tuple) -> Any:
        return model(batch[0], training=False)

    return float(graph_flops(grads if training else forward, (backend.x, backend.y),
                             backend.device.upper()))


COUNTERS = {"jax": _jax_flops, "torch": _torch_flops, "tensorflow": _tf_flops}
