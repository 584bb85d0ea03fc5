"""scenario=converge for JAX: the optimiser rebuilt once with its learning rate as an input
of the step (``optax.inject_hyperparams``, the same AdamW and constants as ``train.optimizer``)
so the scenario's schedule sets it per step without a recompile; host batches put on the mesh,
and the eval-mode forward's logits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

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
    tx = optax.inject_hyperparams(optax.adamw)(
        learning_rate=lr, b1=ADAMW["b1"], b2=ADAMW["b2"], eps=ADAMW["eps"],
        weight_decay=ADAMW["weight_decay"])
    state = backend.state._replace(opt_state=tx.init(backend.state.params))
    backend.state = parallel.replicate(state, backend.mesh)
    backend.use_step(train.make_step(backend.graphdef, tx, backend.jit, backend.replicated,
                                     backend.sharded, donate=False))
    backend.converge_step = True


def train_on_host(backend: JaxBackend, batch: dict, lr: float) -> jax.Array:
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
