"""Capability ``serve_buckets`` for Keras 3 (scenario=serve's padded batch sizes): the resident
batch swapped for one of another size while a step or decoder is prepared on it. Keras exposes
no count of its backend's compilations: ``compiles`` is None and the run says so (tag
``fxtrack.serve_recompiles``)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator, Optional

from fxtrack.frameworks.keras import data

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.keras.backend import KerasBackend

NOT_COUNTED = "not counted: Keras has no count of its backend's compilations"


@contextlib.contextmanager
def resident(backend: KerasBackend, batch_size: int) -> Iterator[None]:
    """While open, ``backend.x`` (and its targets) hold ``batch_size`` samples."""
    built = backend.x, backend.y, backend.sample_weight
    backend.x, backend.y, backend.sample_weight = data.device_batch(backend.arch, batch_size,
                                                                    backend.spec.seed)
    try:
        yield
    finally:
        backend.x, backend.y, backend.sample_weight = built


def compiles(backend: KerasBackend) -> Optional[int]:
    return None
