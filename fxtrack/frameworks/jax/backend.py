"""The JAX Backend: wires models, data, devices and the training step together."""

from __future__ import annotations

from typing import Any, Optional

import jax
from flax import nnx

from fxtrack.frameworks.base import Backend
from fxtrack.frameworks.jax import data, devices, models, train


class JaxBackend(Backend):
    name = "jax"

    def version(self) -> str:
        return jax.__version__

    def device_kind(self) -> str:
        self.device = devices.select(self.spec.hardware)
        return devices.kind(self.device)

    def device_tags(self) -> dict[str, str]:
        return devices.tags(self.device)

    def build(self, batch_size: int) -> None:
        dtype = train.COMPUTE_DTYPES[self.spec.precision]  # parameters stay float32
        tx = train.optimizer(self.arch)
        with jax.default_device(self.device):
            model = models.build(self.arch, dtype, nnx.Rngs(self.spec.seed))
            model.train()  # BatchNorm normalises with (and updates) batch statistics
            self.graphdef, state = train.init_state(model, tx, self.spec.precision)
        # Committed to the device, as the step's outputs are: else the second call recompiles.
        self.state = jax.device_put(state, self.device)
        self.batch = data.device_batch(self.arch, batch_size, self.spec.seed, self.device)
        self._step = train.make_step(self.graphdef, tx, jit=self.spec.compile)

    def param_count(self) -> int:
        return sum(x.size for x in jax.tree.leaves(self.state.params))

    def train_step(self) -> jax.Array:
        self.state, loss = self._step(self.state, self.batch)
        return loss.block_until_ready()  # note: the host waits for the whole step here

    def loss_value(self, handle: Any) -> float:
        return float(handle)

    def peak_memory_bytes(self) -> Optional[int]:
        return devices.peak_memory_bytes(self.device)
