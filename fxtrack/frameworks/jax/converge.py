"""scenario=converge for JAX: the optimiser rebuilt once with its learning rate as an input
of the step (``optax.inject_hyperparams``, the same AdamW and constants as ``train.optimizer``)
so the scenario's schedule sets it per step without a recompile; host batches put on the mesh
(one device, or split over ``devices`` with the state replicated or, with parallel=fsdp,
sharded as the build shards it), and the eval-mode forward's logits. Also the
``converge_devices`` capability: one process drives every device of the mesh."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fxtrack.frameworks import initial
from fxtrack.frameworks.base import ADAMW, optimizer_choice
from fxtrack.frameworks.declaration import NotSupported
from fxtrack.frameworks.jax import parallel, train

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.jax.backend import JaxBackend


def _scheduled(backend: JaxBackend) -> None:
    """On the first call: AdamW with an injected rate, its state in place of the built one."""
    if getattr(backend, "converge_step", None) is not None:
        return
    kind, lr = optimizer_choice(backend.arch, backend.batch_size)
    if kind != "adamw":
        raise NotSupported(f"scenario=converge schedules AdamW; model family "
                           f"{backend.arch.family!r} trains with {kind}")
    same_start(backend)
    tx = optax.inject_hyperparams(optax.adamw)(
        learning_rate=lr, b1=ADAMW["b1"], b2=ADAMW["b2"], eps=ADAMW["eps"],
        weight_decay=ADAMW["weight_decay"])
    state = backend.state._replace(opt_state=tx.init(backend.state.params))
    if backend.spec.parallel == "fsdp":  # the state placed shard by shard, as the build does
        backend.state, step = parallel.fsdp(state, backend.mesh, functools.partial(
            train.train_step, backend.graphdef, tx), backend.sharded, donate=False)
        backend.use_step(step)
    else:  # replicated: on several devices XLA all-reduces the gradients of the split batch
        backend.state = parallel.replicate(state, backend.mesh)
        backend.use_step(train.make_step(backend.graphdef, tx, backend.jit, backend.replicated,
                                         backend.sharded, donate=False))
    backend.converge_step = True


def train_on_host(backend: JaxBackend, batch: dict, lr: float) -> jax.Array:
    """One step on the global host batch: split over the mesh's devices (each takes its rows in
    order, as a single device's batch holds them all), so the loss and the averaged gradients
    are the global batch's."""
    _scheduled(backend)
    opt = backend.state.opt_state
    hyper = {**opt.hyperparams, "learning_rate": jax.device_put(
        jnp.asarray(lr, opt.hyperparams["learning_rate"].dtype), backend.replicated)}
    backend.state = backend.state._replace(opt_state=opt._replace(hyperparams=hyper))
    return backend.train_on(parallel.put_local_batch(batch, backend.mesh))


def outputs(backend: JaxBackend, batch: dict) -> Any:
    if getattr(backend, "converge_forward", None) is None:  # one jitted forward for every eval
        graphdef = train.eval_graphdef(backend.graphdef, backend.state)
        backend.converge_forward = train.make_forward(graphdef, backend.jit)
    forward = backend.converge_forward
    x = jnp.asarray(train.model_inputs(batch))
    logits = forward(backend.state.params, backend.state.batch_stats, x)
    return np.asarray(logits, dtype=np.float32)


# Flax path part -> PyTorch's (fxtrack.frameworks.torch.models), where they differ
_RENAMES = {"fc1": "0", "fc2": "2", "input_layernorm": "attn_norm",
            "post_attention_layernorm": "mlp_norm", "self_attn": "attn"}
_LEAVES = {"kernel": "weight", "scale": "weight", "embedding": "weight"}


def torch_name(path: tuple) -> str:
    """A Flax parameter's path as PyTorch names the same parameter."""
    parts = [_RENAMES.get(str(p), str(p)) for p in path]
    return ".".join([*parts[:-1], _LEAVES.get(parts[-1], parts[-1])])


def _from_torch_layout(leaf: str, shape: tuple, name: str, seed: int,
                       value: Any = initial.value) -> Any:
    """``value`` (the shared start's draw, or saved weights) of a Flax parameter of ``shape``:
    in PyTorch's layout (Linear (out, in), Conv (O, I, kH, kW)) and laid out the Flax way."""
    if leaf == "kernel" and len(shape) == 2:
        return value(name, shape[::-1], seed).T
    if leaf == "kernel" and len(shape) == 4:  # (kH, kW, I, O) <- (O, I, kH, kW)
        kh, kw, i, o = shape
        return value(name, (o, i, kh, kw), seed).transpose(2, 3, 1, 0)
    return value(name, shape, seed)


def weights(backend: JaxBackend) -> dict[str, Any]:
    """The trained parameters under PyTorch's names and layout (``initial.save`` writes them):
    ``_from_torch_layout``'s inverse."""
    from flax import nnx

    out = {}
    for path, var in nnx.to_flat_state(backend.state.params):
        array = np.asarray(jax.device_get(var.value), np.float32)
        if str(path[-1]) == "kernel":
            array = array.T if array.ndim == 2 else array.transpose(3, 2, 0, 1)
        out[torch_name(path)] = array
    return out


def load_weights(backend: JaxBackend, path: str) -> None:
    """The saved weights in place of the built ones (model.from_run: evaluation only; a
    converge step after it would start again from the shared start)."""
    same_start(backend, initial.loaded(path))


def same_start(backend: JaxBackend, value: Any = initial.value) -> None:
    """Every parameter from ``fxtrack.frameworks.initial`` (the start every framework shares),
    or from ``value`` (``initial.loaded``: saved weights)."""
    from flax import nnx

    flat = nnx.to_flat_state(backend.state.params)
    drawn = [(path, var.replace(value=jnp.asarray(_from_torch_layout(
        str(path[-1]), tuple(var.value.shape), torch_name(path), backend.spec.seed, value),
        var.value.dtype))) for path, var in flat]
    params = parallel.replicate(nnx.from_flat_state(drawn), backend.mesh)
    backend.state = backend.state._replace(params=params)


def exported_input(backend, batch: dict) -> np.ndarray:
    return np.ascontiguousarray(batch["images"] if "images" in batch else batch["input_ids"])
