"""The TensorFlow Backend: wires models, data, devices, parallelism and the training step together
(the optional capabilities are modules of this package: fxtrack.frameworks.tensorflow.FRAMEWORK)."""

from __future__ import annotations

import os
from typing import Any, Callable, ContextManager, Optional

import keras
import numpy as np
import tensorflow as tf

from fxtrack import families, policy
from fxtrack.frameworks import keras_models as models
from fxtrack.frameworks.base import Backend, PeakMemory
from fxtrack.frameworks.tensorflow import data, devices, matmul, parallel, train


class TensorFlowBackend(Backend):
    name = "tensorflow"

    def version(self) -> str:
        return tf.__version__

    def device_kind(self) -> str:
        if not hasattr(self, "device"):  # the first call: before TF initialises its devices
            self.policy_tags = devices.configure(self.spec.precision,
                                                 policy.cpu_threads(self.spec.cpu_threads))
            self.device = devices.select(self.spec.hardware)
            if self.spec.nodes > 1:
                # The worker writes the Result only where RANK is "0" (or unset), as under
                # torchrun: node 0's worker speaks for every node.
                os.environ["RANK"] = str(self.spec.node_rank)
        return "gpu" if "GPU" in self.device else "cpu"

    @property
    def strategy(self) -> tf.distribute.Strategy:
        """Made on first use, after the worker's refusal check: a refused combination (fsdp,
        say) configures no logical devices, which a process can do only once."""
        if "_strategy" not in self.__dict__:
            self._strategy = parallel.create(self.spec, self.device)
        return self._strategy

    def device_tags(self) -> dict[str, str]:
        tags = {**devices.tags(self.device), "keras": keras.__version__,
                **getattr(self, "policy_tags", {})}
        if hasattr(self, "model"):  # what the built model ran
            tags["compile_mode"] = self.framework.compile_mode_tag(self.spec.compile)
            builder = models.BUILDERS.get(self.arch.family)  # None: a user's model
            if builder is not None:
                tags["matmul_form"] = matmul.fast_path(self.spec.precision, self.device_kind(),
                                                       xla=bool(self.spec.compile))[1]
            if builder is not None and builder.attention is not None:
                tags["attention"] = (train.LLAMA_ATTENTION if builder.attention == "causal_gqa"
                                     else train.ATTENTION)
        return tags

    def reduce_max(self, value: float) -> float:
        return parallel.reduce_max(self.strategy, value)

    def visible_devices(self) -> list[str]:
        return devices.visible()

    def placement(self) -> ContextManager[None]:
        """Where variables are made and steps traced: under the strategy (mirrored on every
        replica) or on the one device."""
        return parallel.placement(self.strategy, self.device)

    def build(self, batch_size: int) -> None:
        own = families.of(self.arch).user
        if own is not None:  # a model its own builder makes (model=custom), the same step
            return self.capability(own.builder_capability).build(self, batch_size)
        keras.utils.set_random_seed(self.spec.seed)  # Python, NumPy and TF/Keras initialisers
        with self.placement():  # mirrored variables on every replica, or the one device
            # bf16 on a CPU: dense layers in the form XLA:CPU's bf16 kernels take, where the
            # step runs under XLA (the matmul decides as it is traced)
            fast = matmul.fast_path(self.spec.precision, self.device_kind(), xla=True)[0]
            with train.precision_policy(self.spec.precision), \
                    models.matmul_form(matmul.matmul if fast else None):
                # memory=checkpoint never gets here: TensorFlow declares no ``remat``.
                self.model = models.build(self.arch)
            # num_replicas_in_sync already counts every worker's replicas
            self.opt = train.optimizer(self.arch, self.spec.precision,
                                       batch_size * self.strategy.num_replicas_in_sync)
        if self.strategy.num_replicas_in_sync > 1:  # batch_size per replica, each its own shard
            self.batch = data.replica_batches(self.arch, batch_size, self.spec.seed, self.strategy)
        else:
            self.batch = data.device_batch(self.arch, batch_size, self.spec.seed, self.device)
        self._step = None  # made by the first train_step (inference never allocates the slots)

    def param_count(self) -> int:
        return sum(int(np.prod(v.shape)) for v in self.model.trainable_variables)

    @property
    def step_made(self) -> bool:
        """Whether the training step exists yet (the first ``train_step`` makes it, model=custom's
        build before): until then the optimiser has no slots."""
        return self._step is not None

    def use_step(self, step: Callable[[Any], Any]) -> None:
        """Train with ``step`` (batch -> loss), made for a model this backend's build did not
        make (model=custom: the ``user_model`` capability)."""
        self._step = step

    def train_on(self, batch: Any) -> np.ndarray:
        """One training step on ``batch`` (the resident one, or a loader's); the loss."""
        with self.placement():
            if self._step is None:  # the first step: optimiser slots, tracing, compilation
                self._step = train.make_step(self.model, self.opt, self.strategy,
                                             self.spec.compile)
            loss = self._step(batch)  # averaged over the replicas
        # The loss is ready before the last updates are: on a GPU, wait for every device's
        # queued kernels (each replica's update), not only the averaged loss. On a CPU the
        # tf.function returns once all its stateful ops ran (automatic control dependencies).
        devices.sync(self.device)
        return loss.numpy()

    def train_step(self) -> np.ndarray:
        return self.train_on(self.batch)

    def step_hlo(self) -> Optional[str]:
        """The optimised HLO text of the training step where XLA compiles it whole (one replica,
        framework.compile on), else None (a tf.function graph: the trace names its ops). The
        profile capability maps the trace's instruction names to what they run."""
        if not (self.spec.compile and self.strategy.num_replicas_in_sync == 1 and self.step_made):
            return None
        with self.placement():
            return self._step.experimental_get_compiler_ir(self.batch)(stage="optimized_hlo")

    def state_bytes_per_device(self) -> Optional[int]:
        # Mirrored (or single-device) variables: every replica holds each one in full.
        variables = [*self.model.weights, *self.opt.variables]
        return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables)

    def loss_value(self, handle: Any) -> float:
        return float(handle)

    def peak_memory(self) -> Optional[PeakMemory]:
        return PeakMemory.fullest([devices.peak_memory(d) for d in
                                   parallel.replica_devices(self.strategy, self.device)])

    def replica_batch(self) -> dict[str, tf.Tensor]:
        """The first replica's resident batch (inference and the exports run on one device)."""
        if self.strategy.num_replicas_in_sync > 1:
            return self.strategy.experimental_local_results(self.batch)[0]
        return self.batch

    def synced(self, forward: Callable[[], Any]) -> Callable[[], None]:
        """``forward`` as a step that runs on this backend's device and returns when the device
        has finished."""
        def step() -> None:
            with tf.device(self.device):
                forward()
            devices.sync(self.device)

        return step
