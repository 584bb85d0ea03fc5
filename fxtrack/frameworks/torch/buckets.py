"""Capability ``serve_buckets`` for PyTorch (scenario=serve's padded batch sizes): the resident
batch swapped for one of another size while a step or decoder is prepared on it, and dynamo's
count of the graphs it compiled, so a window can show it compiled none."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator

from fxtrack.frameworks.torch import data, parallel

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.torch.backend import TorchBackend


@contextlib.contextmanager
def resident(backend: TorchBackend, batch_size: int) -> Iterator[None]:
    """While open, ``backend.batch`` holds ``batch_size`` synthetic samples (the same seed);
    the inference step and the decoder read it when prepared."""
    built = backend.batch
    backend.batch = data.device_batch(backend.arch, batch_size,
                                      backend.spec.seed + parallel.rank(), backend.device,
                                      backend.channels_last)
    try:
        yield
    finally:
        backend.batch = built


def compiles(backend: TorchBackend) -> int:
    """Graphs torch.compile (dynamo) has compiled in this process so far; 0 when eager."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
