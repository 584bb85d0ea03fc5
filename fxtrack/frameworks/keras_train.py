"""What the two Keras-based frameworks (tensorflow, keras) train with, on any Keras backend: the
dtype policy per precision and the optimisers. Imports only ``keras``, like ``keras_models``."""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import keras
from keras import ops

from fxtrack.architectures import Arch
from fxtrack.frameworks import user_builder as ub
from fxtrack.frameworks.base import ADAMW, SGD, optimizer_choice

# Keras dtype policies: compute dtype / variable dtype. The mixed ones keep fp32 variables.
# tf32 is float32 compute (TF32 matmuls are a device setting: each framework's devices.configure).
POLICIES = {"fp32": "float32", "tf32": "float32", "bf16": "mixed_bfloat16",
            "fp16": "mixed_float16"}


@contextlib.contextmanager
def precision_policy(precision: str) -> Iterator[None]:
    """Make ``precision``'s Keras dtype policy global while a model is built (layers read it
    when they are constructed), then restore the previous one."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(POLICIES[precision])
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


class CoupledSGD(keras.optimizers.SGD):
    """SGD with momentum and *coupled* L2 weight decay, exactly as ``torch.optim.SGD``:
    ``g += wd * w`` before the momentum update. (Keras' own ``weight_decay`` is decoupled.)"""

    def __init__(self, l2: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.l2 = l2

    def update_step(self, gradient, variable, learning_rate):
        gradient = ops.add(ops.cast(gradient, variable.dtype),
                           ops.multiply(variable, ops.cast(self.l2, variable.dtype)))
        super().update_step(gradient, variable, learning_rate)


def optimizer(arch: Arch, precision: str, global_batch: int = 256) -> keras.optimizers.Optimizer:
    """SGD+momentum (coupled L2) for ResNet-50, AdamW for transformers; with dynamic loss
    scaling in fp16 (as torch's GradScaler)."""
    kind, lr = optimizer_choice(arch, global_batch)
    if kind == "sgd":
        opt = CoupledSGD(SGD["weight_decay"], learning_rate=lr, momentum=SGD["momentum"])
    else:
        opt = keras.optimizers.AdamW(learning_rate=lr, beta_1=ADAMW["b1"],
                                     beta_2=ADAMW["b2"], epsilon=ADAMW["eps"],
                                     weight_decay=ADAMW["weight_decay"])
    if precision == "fp16":
        # dynamic, halves on overflow; starts at 2**16 like torch's GradScaler and fxtrack's JAX
        # step (Keras' default is 2**15)
        opt = keras.optimizers.LossScaleOptimizer(opt, initial_scale=2.0**16)
    return opt


def abstract_param_count(backend) -> int:
    """The memory pre-check's count for a user's ``keras.Model`` (model=custom, either
    Keras-based framework): the builder called in a ``keras.StatelessScope``, where Keras defers
    every variable's initialiser (a shape-only build; left uninitialised on leaving it: this
    process only counts), at ub.ABSTRACT_BATCH; its trainable elements."""
    arch, fw = backend.arch, backend.framework
    with keras.StatelessScope(initialize_variables=False):
        model = ub.call(arch, fw, ub.ABSTRACT_BATCH, backend.spec.seed)[0]
    ub.expect(isinstance(model, keras.Model), arch, fw, "a model", "a keras.Model", model)
    return sum(math.prod(v.shape) for v in model.trainable_variables)
