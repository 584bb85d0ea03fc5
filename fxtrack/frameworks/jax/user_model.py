"""model=custom in JAX: the user's ``flax.nnx.Module`` with NumPy or JAX arrays and its loss,
trained by fxtrack's step (the functional split, compute dtype, fp16 loss scaling, jit, the
batch sharded over the mesh, the state too under parallel=fsdp, ``nnx.remat`` on its policy's
blocks) as its own models are; FLOPs from XLA's
``jax.jit(...).lower(...).compile().cost_analysis()`` of one forward + backward."""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from fxtrack.frameworks import user_builder as ub
from fxtrack.frameworks.declaration import NotSupported
from fxtrack.frameworks.jax import models, parallel, train


def build(backend: Any, batch_size: int) -> None:
    spec, arch, fw = backend.spec, backend.arch, backend.framework
    backend.mesh = parallel.make_mesh(backend.device, spec.devices)
    backend.replicated = parallel.replicated(backend.mesh)
    backend.sharded = parallel.batch_sharding(backend.mesh)
    tx = train.optimizer(arch, batch_size * spec.devices * spec.nodes)
    # One process drives every device: the builder's batch is the global one, sharded over them.
    backend.user_batch = batch_size * spec.devices
    with jax.default_device(backend.device):
        model, inputs, targets, user_loss = ub.call(arch, fw, backend.user_batch, spec.seed)
        backend.seq_len = ub.sequence_length(arch, fw, inputs)
        ub.expect(isinstance(model, nnx.Module), arch, fw, "a model", "a flax.nnx.Module",
                  model)
        for x in ub.leaves(inputs) + ub.leaves(targets):
            ub.expect(isinstance(x, (np.ndarray, jax.Array)), arch, fw, "an input or target",
                      "NumPy or JAX arrays", x)
        model.train()
        # the policy's blocks, checked before any work (a misnamed class: one line)
        remat_units = blocks(backend, model)
        if spec.memory == "checkpoint":  # activations recomputed per block in backward
            models.checkpoint_blocks(remat_units)
        # the step carries parameters and every other variable (BatchNorm's statistics,
        # Dropout's RNG state) through each step
        backend.graphdef, state = train.init_state(model, tx, spec.precision)
    backend.loss_of = loss_of(user_loss, train.COMPUTE_DTYPES[spec.precision])
    backend.state = parallel.replicate(state, backend.mesh)
    batch = (inputs, targets)
    backend.batch = jax.block_until_ready(jax.device_put(batch, backend.sharded))
    check_scalar(backend)
    backend.jit = backend.resolve_jit()
    donate, backend.donation = train.donates(backend.device_kind())
    backend.use_step(train.make_step(backend.graphdef, tx, backend.jit, backend.replicated,
                                     backend.sharded, donate, loss_of=backend.loss_of))
    if spec.parallel == "fsdp":  # state sharded over the mesh, the step jitted for it
        backend.state, step = parallel.fsdp(state, backend.mesh, functools.partial(
            train.train_step, backend.graphdef, tx, loss_of=backend.loss_of), backend.sharded,
            donate)
        backend.use_step(step)


def blocks(backend: Any, model: nnx.Module) -> list[nnx.Module]:
    """memory=checkpoint's blocks of the user's model under ``user_builder``'s policy
    (model.remat_modules, or the items of its first ``nnx.List`` / ``nnx.Sequential`` of 2 or
    more modules of one class), found when asked or named. parallel=fsdp needs no units in JAX:
    every array of the state is sharded by ``parallel.fsdp_shardings``' rule and XLA schedules
    each gather, so model.shard_modules, which would pick units, is refused here."""
    spec, arch, fw = backend.spec, backend.arch, backend.framework
    if arch.dims.get("shard_modules"):
        raise NotSupported("model.shard_modules is not supported by jax: it has no sharding "
                           "units (every parameter is split along its largest axis the device "
                           "count divides, XLA schedules the gathers); unset it for "
                           "framework=jax")
    if spec.memory != "checkpoint" and not arch.dims.get("remat_modules"):
        return []
    return ub.policy_blocks(arch, fw, model, "remat_modules", _submodules,
                            lambda m: isinstance(m, (nnx.List, nnx.Sequential)))


def _submodules(module: nnx.Module) -> list[tuple[Any, nnx.Module]]:
    """(name, submodule) pairs directly under ``module`` (its variables left out)."""
    return [(k, c) for k, c in nnx.iter_children(module) if isinstance(c, nnx.Module)]


def abstract_param_count(backend: Any) -> int:
    """The memory pre-check's count: the builder's model under ``nnx.eval_shape`` (every
    variable a shape, nothing allocated) at ub.ABSTRACT_BATCH, its ``nnx.Param`` elements."""
    arch, fw = backend.arch, backend.framework
    model = nnx.eval_shape(lambda: ub.call(arch, fw, ub.ABSTRACT_BATCH, backend.spec.seed)[0])
    ub.expect(isinstance(model, nnx.Module), arch, fw, "a model", "a flax.nnx.Module", model)
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def loss_of(user_loss: Callable[[Any, Any], Any], dtype: Any) -> Callable[[nnx.Module, tuple], jax.Array]:
    """``train.train_step``'s loss for a user's model: inputs in the compute dtype
    (``in_dtype``), the user's loss in float32."""
    def fn(model: nnx.Module, batch: tuple) -> jax.Array:
        inputs, targets = batch
        return jnp.asarray(user_loss(ub.apply(model, in_dtype(inputs, dtype)), targets),
                           jnp.float32)

    return fn


def check_scalar(backend: Any) -> None:
    """The loss's shape, traced abstractly before any timed work: it must be a scalar."""
    shape = jax.eval_shape(lambda s, b: train.grads_and_loss(backend.graphdef, s, b,
                                                             backend.loss_of)[1],
                           backend.state, backend.batch).shape
    ub.expect(shape == (), backend.arch, backend.framework, "a loss",
              f"loss_fn(outputs, targets) -> a scalar (shape ()), got shape {shape}", shape)


def train_flops_per_sample(backend: Any) -> tuple[float, str]:
    """XLA's count of one compiled forward + backward (no optimiser update, as torch's and
    TensorFlow's counts), per sample."""
    def grads(state: train.TrainState, batch: tuple) -> Any:
        return train.grads_and_loss(backend.graphdef, state, batch, backend.loss_of)[:2]

    cost: Any = jax.jit(grads).lower(backend.state, backend.batch).compile().cost_analysis()
    if isinstance(cost, (list, tuple)):  # older JAX: one dict per computation
        cost = cost[0]
    return float(cost["flops"]) / backend.user_batch, "jax.cost_analysis"


def prepare_inference(backend: Any) -> Callable[[], None]:
    """scenario=inference: the forward in inference mode (BatchNorm running statistics),
    jitted as the training step was, on the resident inputs; reads the live state."""
    forward = jax.jit(eval_forward(backend)) if backend.jit else eval_forward(backend)
    inputs = backend.batch[0]

    def step() -> None:
        jax.block_until_ready(forward(backend.state.params, backend.state.batch_stats, inputs))

    return step


def eval_forward(backend: Any) -> Callable[..., Any]:
    graphdef = train.eval_graphdef(backend.graphdef, backend.state)
    dtype = train.COMPUTE_DTYPES[backend.spec.precision]

    def forward(params: Any, batch_stats: Any, inputs: Any) -> Any:
        return ub.apply(nnx.merge(graphdef, params, batch_stats), in_dtype(inputs, dtype))

    return forward


def in_dtype(inputs: Any, dtype: Any) -> Any:
    """Floating inputs in the compute dtype (parameters stay float32, as for fxtrack's models)."""
    return ub.tree_map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, inputs)


def forward_flops_per_sample(backend: Any) -> tuple[float, str]:
    """XLA's count of one compiled inference-mode forward, per sample."""
    lowered = jax.jit(eval_forward(backend)).lower(backend.state.params,
                                                    backend.state.batch_stats, backend.batch[0])
    cost: Any = lowered.compile().cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0]
    return float(cost["flops"]) / backend.user_batch, "jax.cost_analysis"



def export(backend: Any, directory: Any) -> Callable[[], None]:
    """scenario=checkpoint's serving export (capability ``user_serving_export``): the user's
    model in inference mode as one jitted forward of (weights, inputs) through ``jax.export``
    (serialised StableHLO) with its variables saved beside it by Orbax (``serving.save_program``,
    as fxtrack's own models are exported), loaded back as a server would; a forward of the
    loaded program on the resident inputs."""
    from fxtrack.frameworks.jax import serving

    stats, to_keys = _raw_keys(backend.state.batch_stats)
    live = eval_forward(backend)

    def forward(params: Any, raw_stats: Any, inputs: Any) -> Any:
        return live(params, to_keys(raw_stats), inputs)

    variables = (backend.state.params, stats)
    inputs = backend.batch[0]
    serving.save_program(jax.jit(forward), variables, inputs, directory)
    backend.served = serving.load_program(directory, variables)
    served = backend.served

    def step() -> None:
        jax.block_until_ready(served(inputs))

    return step


def export_error(backend: Any) -> float:
    """The largest relative error of the loaded export's floating outputs against the live
    model's (inference mode, the same inputs): ``max|a - b| / max|b|`` over every output."""
    state, inputs = backend.state, backend.batch[0]
    live = jax.jit(eval_forward(backend))(state.params, state.batch_stats, inputs)
    worst = 0.0
    for a, b in zip(jax.tree.leaves(backend.served(inputs)), jax.tree.leaves(live)):
        if jnp.issubdtype(b.dtype, jnp.floating):
            scale = max(float(jnp.max(jnp.abs(b.astype(jnp.float32)))), 1e-12)
            diff = jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))
            worst = max(worst, float(jnp.max(diff)) / scale)
    return worst


def _raw_keys(tree: Any) -> tuple[Any, Callable[[Any], Any]]:
    """``tree`` with each typed PRNG key (Dropout's RNG state) as its raw ``uint32`` data, which
    ``jax.export`` and Orbax carry as plain arrays, and the function that wraps them back."""
    leaves, treedef = jax.tree.flatten(tree)
    impls = [jax.random.key_impl(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
             else None for x in leaves]
    raw = [x if impl is None else jax.random.key_data(x) for x, impl in zip(leaves, impls)]

    def to_keys(raw_tree: Any) -> Any:
        flat = jax.tree.leaves(raw_tree)
        return jax.tree.unflatten(treedef, [x if impl is None else
                                            jax.random.wrap_key_data(x, impl=impl)
                                            for x, impl in zip(flat, impls)])

    return jax.tree.unflatten(treedef, raw), to_keys
