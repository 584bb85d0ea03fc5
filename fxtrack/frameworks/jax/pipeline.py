"""The JAX input pipeline: Grain, reading the on-disk synthetic dataset (fxtrack.data.on_disk).

Why Grain: it is the loader the JAX ecosystem itself recommends (the Flax and MaxText examples
use it, and JAX's own "data loaders" guide names it first); it is framework-free Python and
NumPy, as JAX wants host batches, with deterministic, seed-driven shuffling and per-sample
randomness, and it runs the per-sample work in worker *processes* (``mp_prefetch``) as
PyTorch's DataLoader does, so the comparison is between two process-based loaders, not
between one and tf.data's C++ thread pool (TensorFlow's backend measures that one).

The pipeline: source -> shuffle -> repeat forever -> per-sample work (``random_map``, with a
generator Grain derives from the seed and the sample's index) -> batch -> worker processes.
The per-sample work is the one fxtrack.data.on_disk fixes: decode the JPEG, flip with probability
1/2, scale to (x - 128) / 64 float32 NHWC; or replace 15% of the tokens by [MASK].

A user's own batch (model=custom) is written as ArrayRecord (Grain's native random-access
format: one record per sample, its arrays' raw bytes one after another) and read back through
``grain.sources.ArrayRecordDataSource``: the per-sample work is read + deserialize (the bytes
viewed as the manifest's dtypes and shapes), then the batch is collated and rebuilt into the
user's (inputs, targets) structure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import grain
import jax
from absl import flags
import numpy as np

from fxtrack.data import on_disk
from fxtrack.architectures import BERT_MASK_FRACTION, BERT_MASK_TOKEN
from fxtrack.frameworks import user_builder as ub
from fxtrack.frameworks.jax import parallel

PREFETCH_PER_WORKER = 4  # batches each worker keeps ready, as the PyTorch loader's prefetch
RECORDS = "array_record"  # model=custom's record format
RECORD_FILE = "records.array_record"


class TokenRows(grain.sources.RandomAccessDataSource):
    """Every row of the token shards, memory-mapped lazily (so that workers re-open them
    rather than receive them pickled)."""

    def __init__(self, directory: Path) -> None:
        self.paths = sorted(directory.glob("tokens-*.npy"))
        rows = [np.load(p, mmap_mode="r").shape[0] for p in self.paths]
        self.index = [(s, i) for s, n in enumerate(rows) for i in range(n)]
        self._shards: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> np.ndarray:
        if self._shards is None:
            self._shards = [np.load(p, mmap_mode="r") for p in self.paths]
        shard, row = self.index[i]
        return np.asarray(self._shards[shard][row], dtype=np.int32)  # (seq_len,)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_shards": None}  # memory maps do not cross processes


def decode_image(sample: tuple[str, int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """JPEG -> (H, W, 3) float32, flipped with probability 1/2, scaled; and its label."""
    from PIL import Image

    path, label = sample
    with Image.open(path) as im:
        pixels = np.asarray(im.convert("RGB"), dtype=np.float32)  # (H, W, 3)
    if rng.random() < 0.5:
        pixels = pixels[:, ::-1]
    x = (pixels - on_disk.PIXEL_OFFSET) / on_disk.PIXEL_SCALE
    return {"images": np.ascontiguousarray(x), "labels": np.int32(label)}


def mask_tokens(tokens: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Dynamic masking: a fresh 15% of the positions replaced by [MASK] each time."""
    masked = rng.random(tokens.shape) < BERT_MASK_FRACTION  # (seq_len,) bool
    return {"input_ids": np.where(masked, BERT_MASK_TOKEN, tokens).astype(np.int32),
            "mlm_labels": tokens, "mlm_weights": masked.astype(np.float32)}


def write_array_record(out: Path, manifest: dict, leaves: list) -> None:
    """model=custom: one ArrayRecord record per sample, the bytes of its row of each array in
    the manifest's order (``group_size:1``: each record readable alone, as random access
    wants)."""
    from array_record.python.array_record_module import ArrayRecordWriter

    writer = ArrayRecordWriter(str(out / RECORD_FILE), "group_size:1")
    try:
        for row in range(manifest["samples"]):
            writer.write(b"".join(np.ascontiguousarray(leaf[row]).tobytes() for leaf in leaves))
    finally:
        writer.close()


class UserSample:
    """model=custom's per-sample work: a record's bytes back to its arrays (a tuple in the
    manifest's order; the loader rebuilds the user's structure per batch)."""

    def __init__(self, manifest: dict) -> None:
        self.leaves = [(np.dtype(jax.numpy.dtype(leaf["dtype"])), tuple(leaf["shape"]))
                       for leaf in manifest["leaves"]]

    def __call__(self, record: bytes) -> tuple[np.ndarray, ...]:
        arrays, at = [], 0
        for dtype, shape in self.leaves:
            n = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            arrays.append(np.frombuffer(record, dtype, count=n // dtype.itemsize,
                                        offset=at).reshape(shape))
            at += n
        return tuple(arrays)


def user_dataset(backend, samples: int) -> tuple[Path, str]:
    """model=custom: the user's batch (this process's host copy of the one on the mesh)
    written as ``samples`` ArrayRecord records; (its directory, the record format)."""
    inputs, targets = (ub.tree_map(np.asarray, t) for t in jax.device_get(backend.batch))
    return (on_disk.ensure_user(RECORDS, inputs, targets, samples, write_array_record),
            RECORDS)


def dataset(directory: Path, seed: int, shard: int = 0, shards: int = 1) -> grain.MapDataset:
    """Endless shuffled samples after the per-sample work; ``shard`` of ``shards`` (one per
    process of a multi-node run, each reading different samples)."""
    manifest = on_disk.user_manifest(directory)
    if manifest is not None:
        source = grain.sources.ArrayRecordDataSource([str(directory / RECORD_FILE)])
        ds = grain.MapDataset.source(source)[shard::shards]
        return ds.shuffle(seed=seed).repeat(None).map(UserSample(manifest))
    if any(directory.glob("tokens-*.npy")):
        source, work = TokenRows(directory), mask_tokens
    else:
        files = sorted((directory / "images").glob("*.jpg"))
        labels = np.load(directory / "labels.npy")
        source, work = [(str(f), int(y)) for f, y in zip(files, labels)], decode_image
    ds = grain.MapDataset.source(source)[shard::shards]
    return ds.shuffle(seed=seed).repeat(None).random_map(work, seed=seed)


def host_loader(directory: Path, batch_size: int, workers: int, seed: int, shard: int = 0,
                shards: int = 1) -> Iterator[dict[str, np.ndarray]]:
    """Endless host batches of ``batch_size`` ({"images": (B, H, W, 3) float32, "labels": (B,)
    int32} or the three (B, T) BERT arrays), made by ``workers`` processes (0: in this one)."""
    if not flags.FLAGS.is_parsed():  # Grain reads its settings from absl flags, which only an
        flags.FLAGS.mark_as_parsed()  # absl app parses: take their defaults
    ds = dataset(directory, seed, shard, shards).batch(batch_size, drop_remainder=True)
    # One read thread per process: the parallelism is the worker processes, as in PyTorch.
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=1))
    if workers > 0:
        it = it.mp_prefetch(grain.MultiprocessingOptions(
            num_workers=workers, per_worker_buffer_size=PREFETCH_PER_WORKER))
    manifest = on_disk.user_manifest(directory)
    if manifest is not None:  # a batch of tuples is a tuple of stacked arrays: rebuild
        return (on_disk.unflatten(manifest, list(b)) for b in it)
    return iter(it)


def loader(backend, directory: Path, batch_size: int, workers: int
           ) -> Iterator[dict[str, np.ndarray]]:
    """Capability ``pipeline``: this process feeds all its mesh devices, so ``batch_size``
    samples for each of them, its own shard of the dataset under jax.distributed."""
    local = len(parallel.local_devices(backend.mesh))
    return host_loader(directory, batch_size * local, workers, backend.spec.seed,
                       jax.process_index(), jax.process_count())


def train_step_on(backend, batch) -> jax.Array:
    """The training step on a host batch, put on the mesh devices first."""
    return backend.train_on(parallel.put_local_batch(batch, backend.mesh))
