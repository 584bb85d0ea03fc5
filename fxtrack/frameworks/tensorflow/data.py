"""The synthetic batch, on the device in TensorFlow's layout (NHWC images, int32 ids)."""

from __future__ import annotations

import tensorflow as tf

from fxtrack.architectures import Arch
from fxtrack.data.synthetic import make_batch


def device_batch(arch: Arch, batch_size: int, seed: int, device: str) -> dict[str, tf.Tensor]:
    """``fxtrack.data.synthetic.make_batch`` copied once onto ``device`` (e.g. ``"/GPU:0"``)."""
    with tf.device(device):
        # tf.identity under the device scope copies the host constant onto the device.
        batch = make_batch(arch, batch_size, seed)
        return {key: tf.identity(tf.constant(value)) for key, value in batch.items()}


def replica_batches(arch: Arch, batch_size: int, seed: int,
                    strategy: tf.distribute.Strategy) -> dict:
    """One batch of ``batch_size`` per replica, each on its replica's device and its own shard:
    seeded by ``seed`` + the replica's global index (as each PyTorch rank's)."""
    def on_replica(ctx: tf.distribute.experimental.ValueContext) -> dict[str, tf.Tensor]:
        batch = make_batch(arch, batch_size, seed + ctx.replica_id_in_sync_group)
        return {key: tf.identity(tf.constant(value)) for key, value in batch.items()}

    return strategy.experimental_distribute_values_from_function(on_replica)
