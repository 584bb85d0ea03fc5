"""A throwaway model family declared by this one module, as fxtrack's own are in
fxtrack/families/: a two-layer MLP on the vision models' synthetic images, with one model
(``mlp2``: its dims, per-device defaults and display name) and a torch builder. Nothing shared
names it; tests register it (``families.register``, the torch builders' registry) and undo it."""

from __future__ import annotations

from fxtrack import families
from fxtrack.families.vision import image_batch, image_shapes

MLP_DIMS = dict(image_size=8, num_classes=4, hidden=16)


def _flops(a) -> int:
    return 2 * (a.image_size * a.image_size * 3 * a.hidden + a.hidden * a.num_classes)


MLP2 = families.Model("mlp2", dict(MLP_DIMS), gpu=(4, 3, 1), cpu=(4, 3, 1),
                      display="MLP (2 layers)")
MLP = families.Family("mlp", size_keys=("image_size", "num_classes", "hidden"), batch=image_batch,
                      describe=image_shapes, forward_flops=_flops,
                      optimizer=lambda arch, batch: ("adamw", 1e-2), models=(MLP2,))


def torch_mlp(arch):
    """The family's torch model (torch imported here, when a test builds it)."""
    import torch.nn as nn

    pixels = arch.image_size * arch.image_size * 3
    return nn.Sequential(nn.Flatten(), nn.Linear(pixels, arch.hidden), nn.ReLU(),
                         nn.Linear(arch.hidden, arch.num_classes))


def jax_mlp(arch, *, dtype, rngs):
    """The family's Flax NNX model, called as the JAX registry calls a builder."""
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self) -> None:
            pixels = arch.image_size * arch.image_size * 3
            self.fc1 = nnx.Linear(pixels, arch.hidden, dtype=dtype, rngs=rngs)
            self.fc2 = nnx.Linear(arch.hidden, arch.num_classes, dtype=dtype, rngs=rngs)

        def __call__(self, images):  # (B, H, W, 3) -> (B, classes)
            return self.fc2(nnx.relu(self.fc1(images.reshape(images.shape[0], -1))))

    return MLP()


def keras_mlp(arch):
    """The family's Keras model (framework=keras and framework=tensorflow)."""
    import keras

    images = keras.Input((arch.image_size, arch.image_size, 3), name="images")
    x = keras.layers.Flatten()(images)
    x = keras.layers.Dense(arch.hidden, activation="relu")(x)
    return keras.Model(images, keras.layers.Dense(arch.num_classes)(x), name=arch.name)
