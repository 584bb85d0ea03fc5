"""A small MLP with BatchNorm and Dropout, written in PyTorch, Keras and Flax NNX: layers whose
state a training step updates (BatchNorm's running statistics; Dropout's seed generator in
Keras, its RNG count in NNX). The same parameter count in every framework (trainable only:
``features*width + width`` for the first layer, ``2*width`` for BatchNorm's scale and offset,
``width*outputs + outputs`` for the head; 8, 16, 4 -> 212)."""

from __future__ import annotations

import numpy as np


def data(batch_size: int, seed: int, features: int, outputs: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch_size, features), dtype=np.float32)
    mix = np.random.default_rng(1234).standard_normal((features, outputs), dtype=np.float32)
    return x, (x @ mix / np.sqrt(features)).astype(np.float32)


def param_count(features: int = 8, width: int = 16, outputs: int = 4) -> int:
    return features * width + width + 2 * width + width * outputs + outputs


def build_torch(batch_size: int, seed: int, features: int = 8, width: int = 16,
                outputs: int = 4, rate: float = 0.1):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(features, width), nn.BatchNorm1d(width), nn.ReLU(),
                          nn.Dropout(rate), nn.Linear(width, outputs))
    x, y = data(batch_size, seed, features, outputs)
    return model, (torch.from_numpy(x), torch.from_numpy(y)), nn.functional.mse_loss


def build_keras(batch_size: int, seed: int, features: int = 8, width: int = 16,
                outputs: int = 4, rate: float = 0.1):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(width),
                              keras.layers.BatchNormalization(), keras.layers.ReLU(),
                              keras.layers.Dropout(rate), keras.layers.Dense(outputs)])

    def loss(out, target):
        return keras.ops.mean(keras.ops.square(out - target))

    return model, data(batch_size, seed, features, outputs), loss


def build_jax(batch_size: int, seed: int, features: int = 8, width: int = 16,
              outputs: int = 4, rate: float = 0.1):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.inner = nnx.Linear(features, width, rngs=rngs)
            self.norm = nnx.BatchNorm(width, rngs=rngs)
            self.drop = nnx.Dropout(rate, rngs=rngs)
            self.head = nnx.Linear(width, outputs, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.head(self.drop(jax.nn.relu(self.norm(self.inner(x)))))

    def loss(out, target):
        return jnp.mean((out - target) ** 2)

    return MLP(nnx.Rngs(seed)), data(batch_size, seed, features, outputs), loss
