"""Capability ``serve_buckets`` for TensorFlow (scenario=serve's padded batch sizes): the
resident batch swapped for one of another size while a step or decoder is prepared on it.
TensorFlow exposes no process-wide count of its traces or XLA compilations: ``compiles`` is
None and the run says so (tag ``fxtrack.serve_recompiles``)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator, Optional

from fxtrack.frameworks.tensorflow import data

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.tensorflow.backend import TensorFlowBackend

NOT_COUNTED = ("not counted: TensorFlow has no process-wide count of tf.function traces or "
               "XLA compilations")


@contextlib.contextmanager
def resident(backend: TensorFlowBackend, batch_size: int) -> Iterator[None]:
    """While open, the (single-replica) resident batch holds ``batch_size`` samples."""
    built = backend.batch
    backend.batch = data.device_batch(backend.arch, batch_size, backend.spec.seed, backend.device)
    try:
        yield
    finally:
        backend.batch = built


def compiles(backend: TensorFlowBackend) -> Optional[int]:
    return None
