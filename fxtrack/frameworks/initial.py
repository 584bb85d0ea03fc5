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


# A converge run's trained weights, kept for model.from_run: one .npz, each parameter under the
# same canonical name and layout as the start above, so every framework loads it the same way.
WEIGHTS_FILE = "weights.npz"


def save(path: Any, named: dict[str, Any]) -> Any:
    """Write ``named`` (canonical name -> array in PyTorch's layout) as float32 at ``path``."""
    import numpy as np

    np.savez(path, **{name: np.asarray(v, np.float32) for name, v in named.items()})
    return path


def loaded(path: Any) -> Any:
    """A ``value``-like function (name, shape, seed) giving the saved parameter instead of a
    draw: the seed is ignored, a missing name or another shape is a ValueError."""
    import numpy as np

    with np.load(path) as f:
        saved = {name: f[name] for name in f.files}

    def from_file(name: str, shape: tuple[int, ...], seed: int) -> Any:
        if name not in saved:
            raise ValueError(f"the saved weights have no parameter {name!r}")
        if tuple(saved[name].shape) != tuple(shape):
            raise ValueError(f"the saved {name!r} is {tuple(saved[name].shape)}, the model's "
                             f"{tuple(shape)}")
        return saved[name]

    return from_file
