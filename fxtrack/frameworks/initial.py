"""One start for every framework (scenario=converge): each parameter drawn from NumPy by its
canonical name (PyTorch's ``named_parameters`` name, which the other frameworks' converge
modules map theirs onto) and the seed, in PyTorch's layout; each framework copies it in its own
layout. The draw follows the transformers' own init (``_init_transformer``: N(0, 0.02)
matrices and embeddings, zero biases), with unit norm scales and a zero class token; the patch
embedding, which PyTorch leaves at its default, is drawn like the other matrices here."""

from __future__ import annotations

import zlib
from typing import Any

STD = 0.02


def value(name: str, shape: tuple[int, ...], seed: int) -> Any:
    """The initial float32 value of parameter ``name`` (PyTorch's name and layout)."""
    import numpy as np

    leaf = name.rpartition(".")[2]
    if leaf == "bias" or name == "cls_token":
        return np.zeros(shape, np.float32)
    if leaf == "weight" and len(shape) == 1:  # LayerNorm / RMSNorm scales
        return np.ones(shape, np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return (rng.standard_normal(shape) * STD).astype(np.float32)
