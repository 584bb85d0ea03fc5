"""Synthetic, learnable batches from one seed, as NumPy arrays every framework copies to its device.

The same seed gives the same bytes in every framework, so parity tests can compare losses. What
a batch holds is its family's (``Family.batch``, fxtrack.families): images for the vision models,
masked token sequences for BERT, next-token sequences for a Llama. Layout is NHWC; PyTorch
permutes.
"""

from __future__ import annotations

from typing import Any

from fxtrack import families
from fxtrack.architectures import Arch


def make_batch(arch: Arch, batch_size: int, seed: int) -> dict[str, Any]:
    """One batch of ``arch``'s family: ``images`` (B, H, W, 3) float32 + ``labels`` (B,) int32
    for vision models; ``input_ids``, ``mlm_labels``, ``mlm_weights`` (B, T) for BERT;
    ``input_ids`` and ``labels`` (B, T) int32 for a Llama."""
    import numpy as np

    return _spec(arch).batch(np.random.default_rng(seed), arch, batch_size)


def describe(arch: Arch, batch_size: int) -> dict[str, dict[str, Any]]:
    """What ``make_batch`` returns, without making it: each array's shape and dtype (for the
    run's dataset input in MLflow)."""
    return _spec(arch).describe(arch, batch_size)


def _spec(arch: Arch) -> families.Family:
    spec = families.of(arch)
    if spec.batch is None or spec.describe is None:
        raise ValueError(f"model family {arch.family!r} has no synthetic batch (its builder "
                         "makes its data)")
    return spec
