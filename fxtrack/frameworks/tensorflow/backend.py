"""The TensorFlow Backend: wires models, data, devices and the training step together."""

from __future__ import annotations

from typing import Any, Callable, Optional

import keras
import numpy as np
import tensorflow as tf

from fxtrack.frameworks.base import Backend
from fxtrack.frameworks.tensorflow import data, devices, models, train


class TensorFlowBackend(Backend):
    name = "tensorflow"

    def version(self) -> str:
        return tf.__version__

    def device_kind(self) -> str:
        if self.spec.devices > 1:  # fail loudly rather than time one device as N
            raise NotImplementedError("devices > 1 (tf.distribute.MirroredStrategy) is not "
                                      "implemented for tensorflow yet")
        self.device = devices.select(self.spec.hardware)
        return "gpu" if "GPU" in self.device else "cpu"

    def device_tags(self) -> dict[str, str]:
        return {**devices.tags(self.device), "keras": keras.__version__}

    def visible_devices(self) -> list[str]:
        return devices.visible()

    def build(self, batch_size: int) -> None:
        keras.utils.set_random_seed(self.spec.seed)  # Python, NumPy and TF/Keras initialisers
        with tf.device(self.device):
            with train.precision_policy(self.spec.precision):
                self.model = models.build(self.arch)
            self.opt = train.optimizer(self.arch, self.spec.precision)
            self.batch = data.device_batch(self.arch, batch_size, self.spec.seed, self.device)
        self._step = None  # made by the first train_step (inference never allocates the slots)

    def param_count(self) -> int:
        return sum(int(np.prod(v.shape)) for v in self.model.trainable_variables)

    def train_step(self) -> np.ndarray:
        with tf.device(self.device):
            if self._step is None:  # the first step: optimiser slots, tracing, compilation
                self._step = train.make_step(self.model, self.opt, self.batch, self.spec.compile)
            loss = self._step()
        return loss.numpy()  # note: fetching the loss is the sync; the step has finished

    def loss_value(self, handle: Any) -> float:
        return float(handle)

    def peak_memory_bytes(self) -> Optional[int]:
        return devices.peak_memory_bytes(self.device)

    def prepare_inference(self) -> Callable[[], None]:
        with tf.device(self.device):
            forward = train.make_inference_step(self.model, self.batch, self.spec.compile)

        def step() -> None:
            with tf.device(self.device):
                forward()
            devices.sync(self.device)

        return step

    def matmul_tflops(self) -> float:
        return devices.matmul_tflops(self.device, self.spec.precision)
