"""A synthetic dataset written once to disk in a realistic form, for ``scenario=pipeline``:
JPEG-encoded images for the vision models, token-id shards for BERT. Generated from the seed,
cached under ``$FXTRACK_CACHE/datasets``; every framework's loader reads the same files and
does the same work on them (see ``augment`` below).

Layout: ``images/000000.jpg ...`` + ``labels.npy`` (int32), or ``tokens-000.npy ...``
(int32, (samples per shard, seq_len)).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from fxtrack import families
from fxtrack.architectures import Arch
from fxtrack.synthetic import make_batch

JPEG_QUALITY = 90
SHARD = 256  # sequences per token shard
# The per-sample work every loader does, identically:
#   images: decode the JPEG, flip horizontally with probability 1/2, scale to float32
#           (x - 128) / 64 in NHWC (PyTorch permutes to NCHW on the device);
#   text:   replace 15% of the positions, chosen at random, by [MASK] (dynamic masking),
#           emitting input_ids, mlm_labels and mlm_weights as fxtrack.synthetic does.
PIXEL_OFFSET, PIXEL_SCALE = 128.0, 64.0


def cache_root() -> Path:
    root = os.environ.get("FXTRACK_CACHE") or Path.home() / ".cache" / "fxtrack"
    return Path(root) / "datasets"


def ensure(arch: Arch, samples: int, seed: int) -> Path:
    """The dataset directory for ``arch`` (its input shape), written on first use in its
    family's format (``Family.dataset``)."""
    form = families.of(arch).dataset
    if form not in FORMATS:
        raise ValueError(f"model family {arch.family!r} has no on-disk dataset")
    shape, write = FORMATS[form]
    name = f"{form}-{shape(arch)}-{samples}-{seed}"
    path = cache_root() / name
    if (path / "complete").exists():
        return path
    tmp = path.with_name(f"{name}.{os.getpid()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    write(arch, samples, seed, tmp)
    (tmp / "complete").write_text("ok\n")
    if not path.exists():
        tmp.rename(path)
    return path


def _write_images(arch: Arch, samples: int, seed: int, out: Path) -> None:
    import numpy as np
    from PIL import Image

    (out / "images").mkdir()
    labels = []
    for start in range(0, samples, 64):
        batch = make_batch(arch, min(64, samples - start), seed + start)
        pixels = np.clip(batch["images"] * PIXEL_SCALE + PIXEL_OFFSET, 0, 255).astype(np.uint8)
        for i, image in enumerate(pixels):
            Image.fromarray(image).save(out / "images" / f"{start + i:06d}.jpg", quality=JPEG_QUALITY)
        labels.extend(batch["labels"].tolist())
    np.save(out / "labels.npy", np.asarray(labels, dtype=np.int32))


def _write_tokens(arch: Arch, samples: int, seed: int, out: Path) -> None:
    import numpy as np

    for shard, start in enumerate(range(0, samples, SHARD)):
        batch = make_batch(arch, min(SHARD, samples - start), seed + start)
        np.save(out / f"tokens-{shard:03d}.npy", batch["mlm_labels"])  # the unmasked ids


# format -> (the input shape in the directory's name, the writer)
FORMATS: dict[str, tuple[Callable[[Arch], str], Callable[[Arch, int, int, Path], None]]] = {
    "jpeg": (lambda a: f"{a.image_size}-{a.num_classes}", _write_images),
    "tokens": (lambda a: f"{a.seq_len}-{a.vocab_size}", _write_tokens),
}
