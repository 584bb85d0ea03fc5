"""Capability ``serve_buckets`` for JAX (scenario=serve's padded batch sizes): the resident
batch swapped for one of another size while a step or decoder is prepared on it, and XLA's
count of the programs it compiled (jax.monitoring's backend-compile event), so a window can
show it compiled none."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator

import jax

from fxtrack.frameworks.jax import data

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.jax.backend import JaxBackend

_COMPILES = [0]
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"  # one per XLA compilation


def _count(event: str, duration_s: float, **kwargs) -> None:
    if event == _BACKEND_COMPILE:
        _COMPILES[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count)


@contextlib.contextmanager
def resident(backend: JaxBackend, batch_size: int) -> Iterator[None]:
    """While open, ``backend.batch`` (and ``batch_size``, which sizes the decoder's cache) hold
    ``batch_size`` synthetic samples (the same seed)."""
    built, built_size = backend.batch, backend.batch_size
    backend.batch = data.mesh_batch(backend.arch, batch_size, backend.spec.seed, backend.mesh)
    backend.batch_size = batch_size
    try:
        yield
    finally:
        backend.batch, backend.batch_size = built, built_size


def compiles(backend: JaxBackend) -> int:
    """XLA compilations in this process since this module was imported."""
    return _COMPILES[0]
