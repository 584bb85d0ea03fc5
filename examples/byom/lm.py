"""A tiny next-token language model, written three times: token embedding, one hidden layer,
a vocabulary head, cross-entropy against the inputs shifted by one. Run it as an LM
(``model.kind=lm``: its inputs are ``(batch, seq_len)`` token ids, the sequence on axis 1) and
fxtrack logs ``tokens_per_s`` and puts it in the report's language-model tables:

    python -m fxtrack framework=torch model=custom model.torch=byom.lm:build_torch model.kind=lm

Same parameter count in every framework: ``vocab*width + width*width + width + width*vocab +
vocab``. The data repeats a fixed token cycle, so the loss falls within a few steps.
"""

from __future__ import annotations

import numpy as np


def tokens(batch_size: int, seed: int, seq_len: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets): each row a run of consecutive ids from a random start, mod vocab; the
    targets are the next token of each position."""
    start = np.random.default_rng(seed).integers(0, vocab, (batch_size, 1))
    ids = (start + np.arange(seq_len + 1)) % vocab
    return ids[:, :-1].astype(np.int32), ids[:, 1:].astype(np.int32)


def param_count(vocab: int = 64, width: int = 32) -> int:
    return vocab * width + width * width + width + width * vocab + vocab


def build_torch(batch_size: int, seed: int, seq_len: int = 16, vocab: int = 64, width: int = 32):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Embedding(vocab, width), nn.Linear(width, width), nn.ReLU(),
                          nn.Linear(width, vocab))
    x, y = tokens(batch_size, seed, seq_len, vocab)

    def loss(logits, target):
        return nn.functional.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1))

    return model, (torch.from_numpy(x).long(), torch.from_numpy(y).long()), loss


def build_keras(batch_size: int, seed: int, seq_len: int = 16, vocab: int = 64, width: int = 32):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((seq_len,), dtype="int32"),
                              keras.layers.Embedding(vocab, width),
                              keras.layers.Dense(width, "relu"), keras.layers.Dense(vocab)])

    def loss(logits, target):
        return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(
            target, logits, from_logits=True))

    return model, tokens(batch_size, seed, seq_len, vocab), loss


def build_jax(batch_size: int, seed: int, seq_len: int = 16, vocab: int = 64, width: int = 32):
    import jax
    import optax
    from flax import nnx

    class LM(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.embed = nnx.Embed(vocab, width, rngs=rngs)
            self.hidden = nnx.Linear(width, width, rngs=rngs)
            self.head = nnx.Linear(width, vocab, rngs=rngs)

        def __call__(self, ids: jax.Array) -> jax.Array:
            return self.head(jax.nn.relu(self.hidden(self.embed(ids))))

    def loss(logits, target):
        return optax.softmax_cross_entropy_with_integer_labels(logits, target).mean()

    return LM(nnx.Rngs(seed)), tokens(batch_size, seed, seq_len, vocab), loss
