"""The JAX Backend: wires models, data, devices and the training step together (the optional
capabilities are modules of this package: fxtrack.frameworks.jax.FRAMEWORK)."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from fxtrack import families
from fxtrack.frameworks.base import Backend, PeakMemory, attention_tokens
from fxtrack.frameworks.declaration import NotSupported
from fxtrack.frameworks import xla_bf16 as matmul
from fxtrack.frameworks.jax import data, devices, models, parallel, train


class JaxBackend(Backend):
    name = "jax"

    def version(self) -> str:
        return jax.__version__

    def device_kind(self) -> str:
        if not hasattr(self, "device"):
            parallel.init(self.spec)  # jax.distributed first: before anything touches a device
            self.policy_tags = devices.configure(self.spec.precision)
            self.device = devices.select(self.spec.hardware)
        return devices.kind(self.device)

    def device_tags(self) -> dict[str, str]:
        tags = {**devices.tags(self.device), **getattr(self, "policy_tags", {})}
        if getattr(self, "forced_jit", False):
            tags["jax_compile"] = "forced: op-by-op SPMD deadlocks on XLA:CPU"
        if hasattr(self, "jit"):  # what the built model ran
            tags["compile_mode"] = self.framework.compile_mode_tag(self.jit)
            tags["jax_donation"] = self.donation
            dtype = train.COMPUTE_DTYPES[self.spec.precision]
            builder = models.BUILDERS.get(self.arch.family)  # None: a user's model
            if builder is not None:  # fxtrack's own models' layers
                tags["matmul_form"] = matmul.fast_path(dtype, self.device.platform)[1]
            if builder is not None and builder.convolutional:
                tags["conv_form"] = matmul.conv_form(self.device.platform)[1]
            if builder is not None and builder.attention is not None:
                if dtype == jnp.float16 and self.device.platform == "cpu":
                    dtype = jnp.float32  # the attention layers' XLA:CPU fp16 workaround
                shape = (self.batch_size, attention_tokens(self.arch), self.arch.heads,
                         self.arch.hidden // self.arch.heads)  # (B, T, heads, head_dim) per device
                llama = builder.attention == "causal_gqa"
                tags["attention"] = devices.attention_tag(
                    shape, dtype, self.arch.kv_heads if llama else None, causal=llama)
        return tags

    def visible_devices(self) -> list[str]:
        return devices.visible()

    def reduce_max(self, value: float) -> float:
        return parallel.reduce_max(value)

    def build(self, batch_size: int) -> None:
        self.batch_size = batch_size
        own = families.of(self.arch).user
        if own is not None:  # a model its own builder makes (model=custom), the same step
            return self.capability(own.builder_capability).build(self, batch_size)
        # One mesh for every case: 1 device, ``devices`` on this host, or every node's.
        self.mesh = parallel.make_mesh(self.device, self.spec.devices)
        self.replicated = parallel.replicated(self.mesh)
        self.sharded = parallel.batch_sharding(self.mesh)
        dtype = train.COMPUTE_DTYPES[self.spec.precision]  # parameters stay float32
        tx = train.optimizer(self.arch, batch_size * self.spec.devices * self.spec.nodes)
        with jax.default_device(self.device):
            model = models.build(self.arch, dtype, nnx.Rngs(self.spec.seed))
            # per-device BatchNorm, as torch DDP and Keras (DeviceBatchNorm's docstring)
            models.per_device_batch_norm(model, self.mesh.devices.size)
            model.train()  # BatchNorm normalises with (and updates) batch statistics
            if self.spec.memory == "checkpoint":  # activations recomputed per block in backward
                models.checkpoint_blocks(model.blocks)
            self.graphdef, state = train.init_state(model, tx, self.spec.precision)
        # Committed to the mesh, as the step's outputs are: else the second call recompiles.
        self.state = parallel.replicate(state, self.mesh)
        self.batch = data.mesh_batch(self.arch, batch_size, self.spec.seed, self.mesh)
        self.jit = self.resolve_jit()
        donate, self.donation = train.donates(self.device_kind(),
                                              self.framework.setting(self.spec, "donate"))
        self._step = train.make_step(self.graphdef, tx, self.jit, self.replicated, self.sharded,
                                     donate)
        if self.spec.parallel == "fsdp":  # state sharded over the mesh, the step jitted for it
            self.state, self._step = parallel.fsdp(state, self.mesh, functools.partial(
                train.train_step, self.graphdef, tx), self.sharded, donate)

    def resolve_jit(self) -> bool:
        """Whether the step is jitted, once the mesh is made (this build's, or model=custom's
        in the ``user_model`` capability): ``spec.compile``, except where op-by-op dispatch cannot run: over several XLA:CPU
        devices (jaxlib 0.10.2) eager primitives whose shardings need a collective deadlock
        at random in the in-process all-reduce rendezvous ("Expected 2 threads to join the
        rendezvous, but only 1 of them arrived"), which aborts the process. There the step is
        jitted anyway, said in the log and in the ``jax_compile`` tag."""
        self.forced_jit = (not self.spec.compile and self.mesh.devices.size > 1
                           and self.device.platform == "cpu")
        if self.forced_jit:
            print("[fxtrack] jax: compile=false over several CPU devices deadlocks in XLA:CPU's "
                  "collectives; jitting the step instead", file=sys.stderr, flush=True)
        return self.spec.compile or self.forced_jit

    def param_count(self) -> int:
        return sum(x.size for x in jax.tree.leaves(self.state.params))

    def train_step(self) -> jax.Array:
        return self.train_on(self.batch)

    def use_step(self, step: Callable[..., Any]) -> None:
        """Train with ``step`` ((state, batch) -> (state, loss)), made for a model this backend's
        build did not make (model=custom: the ``user_model`` capability)."""
        self._step = step

    def train_on(self, batch: dict[str, jax.Array]) -> jax.Array:
        """One training step on ``batch`` (on the mesh: the resident one, or a loader's put
        there); the loss, once the step has finished."""
        self.state, loss = self._step(self.state, batch)
        if self.jit:  # one executable: its outputs (loss and new state) are ready together
            return loss.block_until_ready()  # note: the host waits for the whole step here
        # Op by op, the loss is ready long before the last parameter update: wait for them all.
        jax.block_until_ready(self.state)
        return loss.block_until_ready()

    def step_hlo(self) -> str:
        """The optimised HLO text of the jitted training step (the profile capability maps the
        trace's instruction names to what they run); compiled again for this, after timing."""
        if not self.jit:
            raise NotSupported("the profile split of jax reads the jitted step's HLO; op by op "
                               "(framework.compile=false) there is none: use compile=true")
        return self._step.lower(self.state, self.batch).compile().as_text()

    def state_bytes_per_device(self) -> Optional[int]:
        return parallel.state_bytes_per_device(self.state)

    def loss_value(self, handle: Any) -> float:
        return float(handle)

    def peak_memory(self) -> Optional[PeakMemory]:
        return PeakMemory.fullest([devices.peak_memory(d)
                                   for _, d in parallel.local_devices(self.mesh)])
