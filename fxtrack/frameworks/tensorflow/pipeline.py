"""The TensorFlow input pipeline: ``tf.data`` over the on-disk synthetic dataset
(fxtrack.data.on_disk): parallel read, cache of the raw file bytes, shuffle, parallel decode and
augmentation, batching and prefetching, distributed over the replicas of a strategy. A user's
own batch (model=custom) is written as TFRecord (one ``tf.train.Example`` per sample, each
array a serialized tensor) and parsed back per sample, the rest of the pipeline the same."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import tensorflow as tf

from fxtrack.data import on_disk
from fxtrack.architectures import BERT_MASK_FRACTION, BERT_MASK_TOKEN
from fxtrack.frameworks import user_builder as ub

AUTOTUNE = tf.data.AUTOTUNE
SHUFFLE_BUFFER = 10_000  # samples; the whole dataset when it is smaller
RECORDS = "tfrecord"  # model=custom's record format
RECORD_FILE = "records.tfrecord"


def _images(directory: Path, calls: int) -> tf.data.Dataset:
    """(file bytes, label) pairs: read in parallel, the bytes cached in memory after the first
    epoch (the JPEGs, not the decoded images: decoding stays per-sample work), then shuffled."""
    files = sorted(str(p) for p in (directory / "images").glob("*.jpg"))
    labels = np.load(directory / "labels.npy")  # (N,) int32
    ds = tf.data.Dataset.from_tensor_slices((files, labels))
    ds = ds.map(lambda f, y: (tf.io.read_file(f), y), num_parallel_calls=calls).cache()
    ds = ds.shuffle(min(len(files), SHUFFLE_BUFFER)).repeat()
    return ds.map(_decode, num_parallel_calls=calls, deterministic=False)


def _decode(jpeg: tf.Tensor, label: tf.Tensor) -> dict[str, tf.Tensor]:
    """Decode, flip horizontally with probability 1/2, scale (x - 128) / 64: (H, W, 3) float32."""
    pixels = tf.cast(tf.io.decode_jpeg(jpeg, channels=3), tf.float32)  # (H, W, 3) in [0, 255]
    pixels = tf.cond(tf.random.uniform(()) < 0.5, lambda: tf.reverse(pixels, axis=[1]),
                     lambda: pixels)
    images = (pixels - on_disk.PIXEL_OFFSET) / on_disk.PIXEL_SCALE
    return {"images": images, "labels": label}


def _tokens(directory: Path, calls: int) -> tf.data.Dataset:
    """Token-id sequences from the shards (held in memory: (N, T) int32), shuffled, each masked
    afresh every time it is drawn (dynamic masking)."""
    tokens = np.concatenate([np.load(p) for p in sorted(directory.glob("tokens-*.npy"))])
    ds = tf.data.Dataset.from_tensor_slices(tokens)
    ds = ds.shuffle(min(len(tokens), SHUFFLE_BUFFER)).repeat()
    return ds.map(_mask, num_parallel_calls=calls, deterministic=False)


def _mask(tokens: tf.Tensor) -> dict[str, tf.Tensor]:
    """Replace 15% of the positions, chosen at random, by [MASK]: (T,) ids -> the three (T,)
    tensors of fxtrack.data.synthetic (input_ids, mlm_labels int32; mlm_weights float32)."""
    masked = tf.random.uniform(tf.shape(tokens)) < BERT_MASK_FRACTION  # (T,) bool
    return {"input_ids": tf.where(masked, tf.constant(BERT_MASK_TOKEN, tokens.dtype), tokens),
            "mlm_labels": tokens,
            "mlm_weights": tf.cast(masked, tf.float32)}


def write_tfrecord(out: Path, manifest: dict, leaves: list) -> None:
    """model=custom: one ``tf.train.Example`` per sample, feature ``leaf-<i>`` the i-th
    array's row as ``tf.io.serialize_tensor`` bytes (dtype and shape kept)."""
    with tf.io.TFRecordWriter(str(out / RECORD_FILE)) as writer:
        for row in range(manifest["samples"]):
            features = {f"leaf-{i}": tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[tf.io.serialize_tensor(leaf[row]).numpy()]))
                for i, leaf in enumerate(leaves)}
            writer.write(tf.train.Example(
                features=tf.train.Features(feature=features)).SerializeToString())


def _user_records(directory: Path, manifest: dict, calls: int) -> tf.data.Dataset:
    """model=custom: the TFRecord file read, the serialized samples cached in memory after the
    first epoch (as the JPEG bytes are), shuffled, each parsed back to its arrays (the
    per-sample work: read + deserialize), in the user's (inputs, targets) structure."""
    leaves = manifest["leaves"]
    spec = {f"leaf-{i}": tf.io.FixedLenFeature([], tf.string) for i in range(len(leaves))}

    def parse(record: tf.Tensor) -> tuple:
        features = tf.io.parse_single_example(record, spec)
        arrays = [tf.ensure_shape(tf.io.parse_tensor(features[f"leaf-{i}"],
                                                     tf.as_dtype(leaf["dtype"])), leaf["shape"])
                  for i, leaf in enumerate(leaves)]
        return on_disk.unflatten(manifest, arrays)

    ds = tf.data.TFRecordDataset(str(directory / RECORD_FILE)).cache()
    ds = ds.shuffle(min(manifest["samples"], SHUFFLE_BUFFER)).repeat()
    return ds.map(parse, num_parallel_calls=calls, deterministic=False)


def user_dataset(backend, samples: int) -> tuple[Path, str]:
    """model=custom: the user's batch (the first replica's, as NumPy) written as ``samples``
    TFRecord examples; (its directory, the record format)."""
    inputs, targets = (ub.tree_map(lambda x: x.numpy(), t) for t in backend.one_batch)
    return on_disk.ensure_user(RECORDS, inputs, targets, samples, write_tfrecord), RECORDS


def loader(backend, directory: Path, batch_size: int, workers: int) -> Iterator:
    """Endless batches of ``batch_size`` per replica (``workers`` parallel calls per map, or
    autotuned when 0), prefetched; per-replica values under a multi-device strategy."""
    strategy = backend.strategy
    calls = workers if workers > 0 else AUTOTUNE
    manifest = on_disk.user_manifest(directory)
    if manifest is not None:
        ds = _user_records(directory, manifest, calls)
    elif any(directory.glob("tokens-*.npy")):
        ds = _tokens(directory, calls)
    else:
        ds = _images(directory, calls)
    replicas = strategy.num_replicas_in_sync
    ds = ds.batch(batch_size * replicas, drop_remainder=True).prefetch(AUTOTUNE)
    if replicas == 1:
        return iter(ds)
    options = tf.data.Options()  # every worker reads every file, keeping its share of the batches
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return iter(strategy.experimental_distribute_dataset(ds.with_options(options)))


def train_step_on(backend, batch) -> np.ndarray:
    """The training step on a loader batch (host tensors: the step copies them to the device)."""
    return backend.train_on(batch)
