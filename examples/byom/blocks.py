"""A residual MLP whose hidden layers are repeated blocks in one container, written in PyTorch
(an ``nn.ModuleList`` of ``Block``) and Flax NNX (an ``nnx.List`` of ``Block``): the shape
fxtrack's generic policy for a user's model finds without being told, so ``parallel=fsdp``
shards each block as a unit and ``memory=checkpoint`` recomputes each block in backward
(docs/your-own-model.md#sharding-and-rematerialisation). ``model.shard_modules`` /
``model.remat_modules`` name other classes (``[Linear]``, say) instead.

The same parameter count in both: ``features*width + width + layers*(width*width + width) +
width*outputs + outputs`` (8, 32, 2 layers, 4 -> 2,532). Every dimension is even, so on 2
devices every parameter splits in halves."""

from __future__ import annotations

import numpy as np


def data(batch_size: int, seed: int, features: int, outputs: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch_size, features), dtype=np.float32)
    mix = np.random.default_rng(1234).standard_normal((features, outputs), dtype=np.float32)
    return x, (x @ mix / np.sqrt(features)).astype(np.float32)


def param_count(features: int = 8, width: int = 32, layers: int = 2, outputs: int = 4) -> int:
    return features * width + width + layers * (width * width + width) + width * outputs + outputs


def build_torch(batch_size: int, seed: int, features: int = 8, width: int = 32, layers: int = 2,
                outputs: int = 4):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.relu(self.linear(x))

    class ResidualMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Linear(features, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.head = nn.Linear(width, outputs)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.stem(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    torch.manual_seed(seed)
    x, y = data(batch_size, seed, features, outputs)
    return ResidualMLP(), (torch.from_numpy(x), torch.from_numpy(y)), nn.functional.mse_loss


def build_jax(batch_size: int, seed: int, features: int = 8, width: int = 32, layers: int = 2,
              outputs: int = 4):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.linear = nnx.Linear(width, width, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return x + jax.nn.relu(self.linear(x))

    class ResidualMLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.stem = nnx.Linear(features, width, rngs=rngs)
            self.blocks = nnx.List([Block(rngs) for _ in range(layers)])
            self.head = nnx.Linear(width, outputs, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            x = self.stem(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    def loss(out, target):
        return jnp.mean((out - target) ** 2)

    return ResidualMLP(nnx.Rngs(seed)), data(batch_size, seed, features, outputs), loss
