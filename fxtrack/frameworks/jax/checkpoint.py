"""Save / restore the full training state and export for serving, the JAX way: Orbax for the
state pytree, ``jax.export`` (serialised StableHLO) for the forward program.

The exported artifact is a program and its weights, as a TF SavedModel or a ``torch.export``
``.pt2`` holds both: ``forward.jax_exported`` (the jitted forward, weights as arguments, so the
program stays small) and ``variables/`` (params + BatchNorm statistics, an Orbax checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp
from jax import export as jax_export


def _abstract(tree: Any) -> Any:
    """Shape, dtype and sharding of every leaf: the target Orbax restores into."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def save(state: Any, directory: Path) -> None:
    """Write ``state`` (params, optimiser state, BatchNorm statistics, loss scale) under
    ``directory/state``; returns once the files are complete."""
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(directory.absolute() / "state", state)
        ckpt.wait_until_finished()  # Orbax writes in a background thread


def restore(live: Any, directory: Path) -> Any:
    """The state saved under ``directory``, with ``live``'s structure, dtypes and shardings, so
    the jitted step takes it without recompiling."""
    with ocp.StandardCheckpointer() as ckpt:
        return ckpt.restore(directory.absolute() / "state", _abstract(live))


def export(forward: Callable[..., jax.Array], variables: tuple[Any, Any], x: jax.Array,
           directory: Path) -> None:
    """Serialise the jitted ``forward(params, batch_stats, x)`` for ``x``'s shape and save the
    weights beside it. The program takes the weights as a flat list of arrays, so that neither
    it nor its loader needs Flax's pytree types."""
    leaves, treedef = jax.tree.flatten(variables)

    @jax.jit
    def served(leaves: list[jax.Array], x: jax.Array) -> jax.Array:
        return forward(*jax.tree.unflatten(treedef, leaves), x)

    exported = jax_export.export(served)(_abstract(leaves), _abstract(x))
    (directory / "forward.jax_exported").write_bytes(exported.serialize())  # StableHLO bytes
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(directory.absolute() / "variables", leaves)
        ckpt.wait_until_finished()


def load_exported(directory: Path, like: tuple[Any, Any]) -> Callable[[jax.Array], jax.Array]:
    """The serving side: program and weights read back from disk (weights placed as ``like``'s),
    as a function of the input alone."""
    exported = jax_export.deserialize(bytearray((directory / "forward.jax_exported").read_bytes()))
    with ocp.StandardCheckpointer() as ckpt:
        leaves = ckpt.restore(directory.absolute() / "variables",
                              _abstract(jax.tree.leaves(like)))
    return lambda x: exported.call(leaves, x)
