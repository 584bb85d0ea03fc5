"""The Keras Backend: the shared Keras models and optimisers, trained by Keras' own path
(``compile`` + ``train_on_batch``) on the backend KERAS_BACKEND named at import."""

from __future__ import annotations

from typing import Any, Optional

import keras
import numpy as np

from fxtrack import families, policy
from fxtrack.frameworks import keras_models, keras_train
from fxtrack.frameworks.base import Backend, PeakMemory
from fxtrack.frameworks.declaration import NotSupported
from fxtrack.frameworks.keras import FRAMEWORK, ONE_DEVICE, data, devices, keras_backend, train


class KerasBackend(Backend):
    name = "keras"

    def version(self) -> str:
        return keras.__version__

    def device_kind(self) -> str:
        if not hasattr(self, "device"):
            asked, running = keras_backend(self.spec), devices.backend_name()
            if asked != running:  # KERAS_BACKEND is read once, when keras is first imported
                raise RuntimeError(f"framework.keras_backend={asked}, but keras was imported "
                                   f"with the {running} backend (KERAS_BACKEND)")
            if self.spec.devices * self.spec.nodes > 1:
                raise NotSupported(f"devices > 1 is not supported by keras yet: {ONE_DEVICE}")
            self.policy_tags = devices.configure(self.spec.precision,
                                                 policy.cpu_threads(self.spec.cpu_threads))
            self.device = devices.select(self.spec.hardware)
        return "gpu" if "gpu" in self.device else "cpu"

    def device_tags(self) -> dict[str, str]:
        tags = {**devices.tags(getattr(self, "device", "cpu:0")),
                **getattr(self, "policy_tags", {})}
        if hasattr(self, "compiled"):  # what the built model ran
            tags["compile_mode"] = FRAMEWORK.compile_mode_tag(
                self.compiled, settings={"keras_backend": devices.backend_name()})
            builder = keras_models.BUILDERS.get(self.arch.family)  # None: a user's model
            if builder is not None:
                tags["matmul_form"] = devices.matmul_form(self.spec.precision)[1]
            if builder is not None and builder.convolutional:
                tags["conv_form"] = devices.conv_form()[1]
            if builder is not None and builder.attention is not None:
                tags["attention"] = devices.attention(
                    self.device, causal_gqa=builder.attention == "causal_gqa")
        return tags

    def visible_devices(self) -> list[str]:
        return devices.visible()

    def build(self, batch_size: int) -> None:
        if self.spec.memory == "checkpoint":  # declared absent: NotSupported with the reason
            FRAMEWORK.capability("remat")
        if self.spec.parallel == "fsdp":
            FRAMEWORK.capability("sharded_state")
        builder = keras_models.BUILDERS.get(self.arch.family)  # None: a user's model
        if (self.spec.precision == "fp16" and builder is not None
                and builder.attention is not None
                and devices.backend_name() == "jax" and "gpu" not in self.device):
            raise NotSupported(
                "precision=fp16 with attention is not supported by keras on jax on a CPU: "
                "keras.ops.dot_product_attention asks XLA:CPU for an fp16 x fp16 -> fp32 dot, "
                "which it lacks (framework=jax computes those scores in fp32 there)")
        own = families.of(self.arch).user
        if own is not None:  # a model its own builder makes (model=custom), same compile + step
            self.capability(own.builder_capability).build(self, batch_size)
        else:
            self._build(batch_size)
        # what a step updates, for sync: weights and BatchNorm statistics (optimiser slots are
        # written by the same step; they exist only after the first one)
        self._updated = self.model.weights

    def _build(self, batch_size: int) -> None:
        """fxtrack's own model for ``spec.arch``, its optimiser, compiled, and its batch."""
        # No keras.device scope: the backend's default device is already the one select()
        # named (hardware=cpu hid the GPUs before import; else each backend takes GPU 0), and
        # on torch, building and compiling inside one left train_on_batch without gradients
        # ("No gradients provided for any variable", keras 3.15).
        keras.utils.set_random_seed(self.spec.seed)  # Python, NumPy and the backend's RNG
        with keras_train.precision_policy(self.spec.precision), \
                keras_models.matmul_form(devices.matmul_form(self.spec.precision)[0],
                                         devices.conv_form()[0]):
            self.model = keras_models.build(self.arch)
        self.opt = keras_train.optimizer(self.arch, self.spec.precision, batch_size)
        weighted = keras_models.BUILDERS[self.arch.family].weighted_loss
        self.compiled = train.compile_model(self.model, self.opt, train.loss(weighted),
                                            self.spec.compile_request)
        self.x, self.y, self.sample_weight = data.device_batch(self.arch, batch_size,
                                                               self.spec.seed)

    def param_count(self) -> int:
        return sum(int(np.prod(v.shape)) for v in self.model.trainable_variables)

    def train_step(self) -> float:
        loss = self.model.train_on_batch(self.x, self.y, sample_weight=self.sample_weight,
                                         return_dict=False)  # fetched to the host already
        if not self.compiled or "gpu" in self.device:  # one jitted executable is done as a whole
            devices.sync(self.device, self._updated)
        return loss

    def loss_value(self, handle: Any) -> float:
        return float(handle)

    def peak_memory(self) -> Optional[PeakMemory]:
        return devices.peak_memory(self.device)

    def state_bytes_per_device(self) -> Optional[int]:
        # One device: weights, BatchNorm statistics and optimiser slots, all held in full.
        return sum(int(np.prod(v.shape)) * _itemsize(v.dtype)
                   for v in [*self.model.weights, *self.opt.variables])


def _itemsize(dtype: str) -> int:
    """Bytes per element of a Keras dtype name (``"float32"``, ``"bfloat16"``, ``"int64"``)."""
    if dtype == "bool":
        return 1
    return int("".join(c for c in dtype if c.isdigit())) // 8
