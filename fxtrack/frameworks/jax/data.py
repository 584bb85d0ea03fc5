"""The synthetic batch as JAX arrays on the device (NHWC images, int32 ids and labels)."""

from __future__ import annotations

import jax

from fxtrack.architectures import Arch
from fxtrack.synthetic import make_batch


def device_batch(arch: Arch, batch_size: int, seed: int,
                 device: jax.Device) -> dict[str, jax.Array]:
    """``fxtrack.synthetic.make_batch`` copied to ``device``; JAX's layouts and dtypes are
    the NumPy ones already, so no conversion is needed."""
    batch = jax.device_put(make_batch(arch, batch_size, seed), device)
    return jax.block_until_ready(batch)
