"""The PyTorch input pipeline (capability ``pipeline``): a map-style ``Dataset`` over the
on-disk synthetic dataset and a
``DataLoader`` with worker processes, pinned memory (CUDA) and prefetching."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from fxtrack import datasets
from fxtrack.architectures import BERT_MASK_FRACTION, BERT_MASK_TOKEN
from fxtrack.frameworks.torch import data


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
        x = (pixels - datasets.PIXEL_OFFSET) / datasets.PIXEL_SCALE
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


def _rng() -> np.random.Generator:
    info = get_worker_info()  # one generator per worker process, seeded by torch per epoch
    seed = info.seed if info is not None else torch.initial_seed()
    return np.random.default_rng([seed % 2**32, torch.randint(0, 2**31, ()).item()])


def loader(backend, directory: Path, batch_size: int, workers: int) -> Iterator[dict]:
    """Endless batches: shuffled, ``workers`` decoding processes, 4 batches prefetched each
    (pinned host memory when training on CUDA)."""
    pin = backend.device.type == "cuda"
    dataset = TokenShards(directory) if any(directory.glob("tokens-*.npy")) else JpegImages(directory)
    dl = DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True,
                    num_workers=workers, pin_memory=pin, persistent_workers=workers > 0,
                    prefetch_factor=4 if workers else None)
    while True:
        yield from dl


def train_step_on(backend, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The training step on a loader batch, moved to the device first."""
    return backend.train_on(data.to_device(batch, backend.device, backend.channels_last))
