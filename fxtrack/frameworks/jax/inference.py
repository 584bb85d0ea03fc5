"""scenario=inference (and the checkpoint scenario's live model) for JAX: the forward in inference
mode (BatchNorm running statistics), jitted as the training step was, on the resident batch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from fxtrack.frameworks.jax import train

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.jax.backend import JaxBackend


def prepare(backend: JaxBackend) -> Callable[[], None]:
    graphdef = train.eval_graphdef(backend.graphdef, backend.state)  # BatchNorm: running stats
    forward = train.make_forward(graphdef, backend.jit, backend.replicated, backend.sharded)
    x = train.model_inputs(backend.batch)

    def step() -> None:  # reads the live state: weights as they are when called
        forward(backend.state.params, backend.state.batch_stats, x).block_until_ready()

    return step
