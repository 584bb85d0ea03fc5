"""Serving export for JAX (capability ``serving_export``, the checkpoint scenario): ``jax.export``
(serialised StableHLO) of the jitted forward, with the weights saved beside it by Orbax.

The exported artifact is a program and its weights, as a TF SavedModel or a ``torch.export``
``.pt2`` holds both: ``forward.jax_exported`` (the jitted forward, weights as arguments, so the
program stays small) and ``variables/`` (params + BatchNorm statistics, an Orbax checkpoint).
Deployment exports (ONNX) are ``deployment.py``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import jax
import orbax.checkpoint as ocp
from jax import export as jax_export

from fxtrack.frameworks.jax import train
from fxtrack.frameworks.jax.checkpoint import abstract

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.jax.backend import JaxBackend


def save_program(forward: Callable[..., jax.Array], variables: tuple[Any, Any], x: jax.Array,
                 directory: Path) -> None:
    """Serialise the jitted ``forward(params, batch_stats, x)`` for ``x``'s shape and save the
    weights beside it. The program takes the weights as a flat list of arrays, so that neither
    it nor its loader needs Flax's pytree types."""
    leaves, treedef = jax.tree.flatten(variables)

    @jax.jit
    def served(leaves: list[jax.Array], x: jax.Array) -> jax.Array:
        return forward(*jax.tree.unflatten(treedef, leaves), x)

    exported = jax_export.export(served)(abstract(leaves), abstract(x))
    (directory / "forward.jax_exported").write_bytes(exported.serialize())  # StableHLO bytes
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(directory.absolute() / "variables", leaves)
        ckpt.wait_until_finished()


def load_program(directory: Path, like: tuple[Any, Any]) -> Callable[[jax.Array], jax.Array]:
    """The serving side: program and weights read back from disk (weights placed as ``like``'s),
    as a function of the input alone."""
    exported = jax_export.deserialize(bytearray((directory / "forward.jax_exported").read_bytes()))
    with ocp.StandardCheckpointer() as ckpt:
        leaves = ckpt.restore(directory.absolute() / "variables",
                              abstract(jax.tree.leaves(like)))
    return lambda x: exported.call(leaves, x)


def export(backend: JaxBackend, directory: Path) -> Callable[[], None]:
    """Export into ``directory``, load it back, and return a forward step of the loaded program
    on the resident batch (returns once the output is ready)."""
    graphdef = train.eval_graphdef(backend.graphdef, backend.state)
    # jax.export serialises a jitted function, whatever spec.compile says for live runs.
    forward = train.make_forward(graphdef, True, backend.replicated, backend.sharded)
    variables = (backend.state.params, backend.state.batch_stats)
    x = train.model_inputs(backend.batch)
    save_program(forward, variables, x, directory)
    served = load_program(directory, variables)

    def step() -> None:
        served(x).block_until_ready()

    return step
