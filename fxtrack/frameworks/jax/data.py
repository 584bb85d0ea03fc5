"""The synthetic batch as JAX arrays on the device(s) (NHWC images, int32 ids and labels)."""

from __future__ import annotations

import jax
from jax.sharding import Mesh

from fxtrack.architectures import Arch
from fxtrack.frameworks.jax import parallel
from fxtrack.data.synthetic import make_batch


def device_batch(arch: Arch, batch_size: int, seed: int,
                 device: jax.Device) -> dict[str, jax.Array]:
    """``fxtrack.data.synthetic.make_batch`` copied to ``device``; JAX's layouts and dtypes are
    the NumPy ones already, so no conversion is needed."""
    batch = jax.device_put(make_batch(arch, batch_size, seed), device)
    return jax.block_until_ready(batch)


def mesh_batch(arch: Arch, batch_size: int, seed: int, mesh: Mesh) -> dict[str, jax.Array]:
    """The global batch over ``mesh``: ``batch_size`` samples per device, device ``i``'s drawn
    with seed ``seed + i`` (its own shard, as each DDP rank in PyTorch), so the global shape is
    (batch_size x devices, ...). On one device this is ``device_batch``'s batch."""
    return parallel.shard_batch(lambda i: make_batch(arch, batch_size, seed + i), mesh)
