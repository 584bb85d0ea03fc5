"""The PyTorch input pipeline (capability ``pipeline``): a map-style ``Dataset`` over the
on-disk synthetic dataset, or over a user's own batch written as memory-mapped ``.npy`` arrays
(model=custom), and a ``DataLoader`` with worker processes, pinned memory (CUDA) and
prefetching."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from fxtrack.data import on_disk
from fxtrack import families
from fxtrack.architectures import BERT_MASK_FRACTION, BERT_MASK_TOKEN
from fxtrack.frameworks import user_builder as ub
from fxtrack.frameworks.declaration import NotSupported
from fxtrack.frameworks.torch import data

RECORDS = "npy"  # model=custom's record format (fxtrack.data.on_disk.write_npy)


class JpegImages(Dataset):
    """Decode with PIL, random horizontal flip, scale; returns CHW float32 and the label."""

    def __init__(self, directory: Path) -> None:
        self.files = sorted((directory / "images").glob("*.jpg"))
        self.labels = np.load(directory / "labels.npy")

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        from PIL import Image

        with Image.open(self.files[i]) as im:
            pixels = np.asarray(im.convert("RGB"), dtype=np.float32)  # (H, W, 3)
        if _rng().random() < 0.5:
            pixels = pixels[:, ::-1]
        x = (pixels - on_disk.PIXEL_OFFSET) / on_disk.PIXEL_SCALE
        return {"images": torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1))),
                "labels": torch.tensor(int(self.labels[i]))}


class TokenShards(Dataset):
    """Token-id shards, memory-mapped; dynamic masking of 15% of the positions per sample."""

    def __init__(self, directory: Path) -> None:
        self.shards = [np.load(p, mmap_mode="r") for p in sorted(directory.glob("tokens-*.npy"))]
        self.index = [(s, i) for s, shard in enumerate(self.shards) for i in range(len(shard))]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        shard, row = self.index[i]
        tokens = np.asarray(self.shards[shard][row], dtype=np.int64)
        masked = _rng().random(tokens.shape) < BERT_MASK_FRACTION
        return {"input_ids": torch.from_numpy(np.where(masked, BERT_MASK_TOKEN, tokens)),
                "mlm_labels": torch.from_numpy(tokens),
                "mlm_weights": torch.from_numpy(masked.astype(np.float32))}


class UserRecords(Dataset):
    """model=custom: the user's arrays (``leaf-<i>.npy``), memory-mapped lazily (each worker
    process opens its own maps); a sample is one row of each, copied out, in the manifest's
    order. The collated batch is rebuilt into the user's structure by the loader."""

    def __init__(self, directory: Path, manifest: dict) -> None:
        self.paths = [directory / f"leaf-{i}.npy" for i in range(len(manifest["leaves"]))]
        self.samples = manifest["samples"]
        self._maps: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        if self._maps is None:
            self._maps = [np.load(p, mmap_mode="r") for p in self.paths]
        return tuple(torch.from_numpy(np.array(m[i])) for m in self._maps)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_maps": None}  # memory maps do not cross processes


def _rng() -> np.random.Generator:
    info = get_worker_info()  # one generator per worker process, seeded by torch per epoch
    seed = info.seed if info is not None else torch.initial_seed()
    return np.random.default_rng([seed % 2**32, torch.randint(0, 2**31, ()).item()])


def loader(backend, directory: Path, batch_size: int, workers: int) -> Iterator[dict]:
    """Endless batches: shuffled, ``workers`` decoding processes, 4 batches prefetched each
    (pinned host memory when training on CUDA)."""
    pin = backend.device.type == "cuda"
    manifest = on_disk.user_manifest(directory)
    if manifest is not None:
        dataset: Dataset = UserRecords(directory, manifest)
    elif any(directory.glob("tokens-*.npy")):
        dataset = TokenShards(directory)
    else:
        dataset = JpegImages(directory)
    dl = DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True,
                    num_workers=workers, pin_memory=pin, persistent_workers=workers > 0,
                    prefetch_factor=4 if workers else None)
    while True:
        if manifest is None:
            yield from dl
        else:  # default_collate stacks each array of the tuple: rebuild (inputs, targets)
            yield from (on_disk.unflatten(manifest, list(b)) for b in dl)


def user_dataset(backend, samples: int) -> tuple[Path, str]:
    """model=custom: the user's batch (the CPU copy of the one the backend holds) written as
    ``samples`` rows of ``.npy`` arrays; (its directory, the record format)."""
    def host(x: torch.Tensor) -> np.ndarray:
        try:
            return x.detach().cpu().numpy()
        except TypeError as e:  # bfloat16 and the float8s have no NumPy dtype to write
            raise NotSupported(f"scenario=pipeline cannot write a {x.dtype} input of a user's "
                               f"model as NumPy records: {e}") from None

    inputs, targets = (ub.tree_map(host, t) for t in backend.batch)
    return on_disk.ensure_user(RECORDS, inputs, targets, samples, on_disk.write_npy), RECORDS


def train_step_on(backend, batch) -> torch.Tensor:
    """The training step on a loader batch, moved to the device first (a user's batch as it
    is: its own dtypes and structure)."""
    if families.of(backend.arch).user is not None:  # a builder's batch
        move = lambda x: x.to(backend.device, non_blocking=True)  # noqa: E731
        return backend.train_on(tuple(ub.tree_map(move, t) for t in batch))
    return backend.train_on(data.to_device(batch, backend.device, backend.channels_last))
