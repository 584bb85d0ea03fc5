"""Save / restore the full training state the JAX way (capability ``checkpoint``): Orbax for the
state pytree."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import orbax.checkpoint as ocp

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.jax.backend import JaxBackend


def abstract(tree: Any) -> Any:
    """Shape, dtype and sharding of every leaf: the target Orbax restores into."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def save(backend: JaxBackend, directory: Path) -> None:
    """Write the state (params, optimiser state, BatchNorm statistics, loss scale) under
    ``directory/state``; returns once the files are complete."""
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(directory.absolute() / "state", backend.state)
        ckpt.wait_until_finished()  # Orbax writes in a background thread


def restore(backend: JaxBackend, directory: Path) -> None:
    """Replace the live state as a whole (the jitted step is a pure function of it) by the one
    saved under ``directory``, with the live structure, dtypes and shardings, so the step takes
    it without recompiling."""
    with ocp.StandardCheckpointer() as ckpt:
        backend.state = ckpt.restore(directory.absolute() / "state", abstract(backend.state))
