"""One model, written three times: a 3-layer MLP regressing a fixed linear map of its inputs.

Same layers, same parameter count in every framework:
``features*width + width + width*width + width + width*outputs + outputs``
(16, 256, 16 -> 74,256). Each builder imports only its own framework, so the worker of one
framework never loads another. The data is learnable (targets are a fixed linear map of the
inputs), so the loss falls within a few steps.

FLOPs by hand (multiply-add = 2, matrix multiplies only): forward ``2*W`` per sample, W the
weight count (74,256 - 528 biases = 73,728); backward ``4*W`` less the first layer's input
gradient, which nobody asks for (``2*features*width``): 6*73,728 - 2*16*256 = 434,176 per sample.
"""

from __future__ import annotations

import numpy as np


def data(batch_size: int, seed: int, features: int, outputs: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch_size, features), dtype=np.float32)
    mix = np.random.default_rng(1234).standard_normal((features, outputs), dtype=np.float32)
    return x, (x @ mix / np.sqrt(features)).astype(np.float32)


def param_count(features: int = 16, width: int = 256, outputs: int = 16) -> int:
    return features * width + width + width * width + width + width * outputs + outputs


def train_flops_per_sample(features: int = 16, width: int = 256, outputs: int = 16) -> int:
    weights = features * width + width * width + width * outputs
    return 6 * weights - 2 * features * width


def build_torch(batch_size: int, seed: int, features: int = 16, width: int = 256,
                outputs: int = 16):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(features, width), nn.ReLU(), nn.Linear(width, width),
                          nn.ReLU(), nn.Linear(width, outputs))
    x, y = data(batch_size, seed, features, outputs)
    return model, (torch.from_numpy(x), torch.from_numpy(y)), nn.functional.mse_loss


def build_keras(batch_size: int, seed: int, features: int = 16, width: int = 256,
                outputs: int = 16):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(width, "relu"),
                              keras.layers.Dense(width, "relu"), keras.layers.Dense(outputs)])

    def loss(out, target):
        return keras.ops.mean(keras.ops.square(out - target))

    return model, data(batch_size, seed, features, outputs), loss


def build_jax(batch_size: int, seed: int, features: int = 16, width: int = 256,
              outputs: int = 16):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.layers = nnx.List([nnx.Linear(features, width, rngs=rngs),
                                    nnx.Linear(width, width, rngs=rngs),
                                    nnx.Linear(width, outputs, rngs=rngs)])

        def __call__(self, x: jax.Array) -> jax.Array:
            for layer in self.layers[:-1]:
                x = jax.nn.relu(layer(x))
            return self.layers[-1](x)

    def loss(out, target):
        return jnp.mean((out - target) ** 2)

    return MLP(nnx.Rngs(seed)), data(batch_size, seed, features, outputs), loss
