"""A synthetic dataset written once to disk in a realistic form, for ``scenario=pipeline``:
JPEG-encoded images for the vision models, token-id shards for BERT. Generated from the seed,
cached under ``$FXTRACK_CACHE/datasets``; every framework's loader reads the same files and
does the same work on them (see ``augment`` below).

Layout: ``images/000000.jpg ...`` + ``labels.npy`` (int32), or ``tokens-000.npy ...``
(int32, (samples per shard, seq_len)).

model=custom (``ensure_user``): the user's own ``(inputs, targets)`` batch, its rows repeated to
the dataset's samples, written in the reading framework's own record format (``.npy`` arrays
for PyTorch, TFRecord for TensorFlow, ArrayRecord for Grain) beside ``records.json``, which
names every array (its structure, per-sample shape and dtype). The per-sample work is
read + deserialize + collate: the user's arrays have nothing to decode or augment.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

from fxtrack import families
from fxtrack.architectures import Arch
from fxtrack.data.synthetic import make_batch

JPEG_QUALITY = 90
SHARD = 256  # sequences per token shard
# The per-sample work every loader does, identically:
#   images: decode the JPEG, flip horizontally with probability 1/2, scale to float32
#           (x - 128) / 64 in NHWC (PyTorch permutes to NCHW on the device);
#   text:   replace 15% of the positions, chosen at random, by [MASK] (dynamic masking),
#           emitting input_ids, mlm_labels and mlm_weights as fxtrack.data.synthetic does.
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
    return _cached(f"{form}-{shape(arch)}-{samples}-{seed}",
                   lambda out: write(arch, samples, seed, out))


def _cached(name: str, write: Callable[[Path], None]) -> Path:
    """``cache_root() / name``, written by ``write`` into a private directory on first use and
    renamed into place (concurrent writers of the same dataset do not read half a one)."""
    path = cache_root() / name
    if (path / "complete").exists():
        return path
    tmp = path.with_name(f"{name}.{os.getpid()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    write(tmp)
    (tmp / "complete").write_text("ok\n")
    if not path.exists():
        tmp.rename(path)
    return path


# model=custom: the user's own batch on disk (module docstring)
MANIFEST = "records.json"
# writer(out, manifest, leaves): every array of the batch (``manifest["leaves"]`` order), each
# with ``manifest["samples"]`` rows, written in one framework's record format
UserWriter = Callable[[Path, dict, list], None]


def ensure_user(form: str, inputs: Any, targets: Any, samples: int, write: UserWriter) -> Path:
    """The directory of the user's batch (NumPy ``inputs`` and ``targets``: one array, a tuple
    or a dict each) repeated row by row to ``samples`` rows, in record format ``form``. Cached
    per format, sample count and the batch itself (its structure, shapes, dtypes and bytes):
    written once, read by every later run on the same data."""
    import numpy as np

    manifest = {"format": form, "samples": samples,
                "inputs": _structure(inputs), "targets": _structure(targets), "leaves": []}
    digest = hashlib.sha256()
    leaves = []
    for part, tree in (("inputs", inputs), ("targets", targets)):
        for key, leaf in _items(tree):
            leaf = np.ascontiguousarray(leaf)
            manifest["leaves"].append({"name": f"{part}{key}", "dtype": leaf.dtype.name,
                                       "shape": list(leaf.shape[1:])})
            digest.update(leaf.tobytes())
            leaves.append(leaf)
    digest.update(json.dumps(manifest, sort_keys=True).encode())

    def write_all(out: Path) -> None:
        rows = np.arange(samples) % len(leaves[0])  # the builder's samples, in turn
        write(out, manifest, [np.take(leaf, rows, axis=0) for leaf in leaves])
        (out / MANIFEST).write_text(json.dumps(manifest, indent=1))

    return _cached(f"user-{form}-{digest.hexdigest()[:16]}-{samples}", write_all)


def user_manifest(directory: Path) -> dict | None:
    """The records' description when ``directory`` holds a user's batch (else None)."""
    path = directory / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def _structure(tree: Any) -> dict:
    if isinstance(tree, dict):
        return {"kind": "dict", "keys": list(tree)}
    if isinstance(tree, (tuple, list)):
        return {"kind": "tuple", "size": len(tree)}
    return {"kind": "array"}


def _items(tree: Any) -> list[tuple[str, Any]]:
    """(name suffix, array) of each array of one array, a tuple or a dict."""
    if isinstance(tree, dict):
        return [(f".{k}", v) for k, v in tree.items()]
    if isinstance(tree, (tuple, list)):
        return [(f".{i}", v) for i, v in enumerate(tree)]
    return [("", tree)]


def unflatten(manifest: dict, leaves: list) -> tuple[Any, Any]:
    """``(inputs, targets)`` in the user's structure from the arrays in ``leaves`` order (any
    framework's arrays: the loaders rebuild each batch with it)."""
    out, at = [], 0
    for part in ("inputs", "targets"):
        shape = manifest[part]
        n = {"dict": len(shape.get("keys", ())), "tuple": shape.get("size", 0)}.get(shape["kind"], 1)
        chunk, at = leaves[at:at + n], at + n
        if shape["kind"] == "dict":
            out.append(dict(zip(shape["keys"], chunk)))
        elif shape["kind"] == "tuple":
            out.append(tuple(chunk))
        else:
            out.append(chunk[0])
    return out[0], out[1]


def write_npy(out: Path, manifest: dict, leaves: list) -> None:
    """Record format ``npy``: one ``leaf-<i>.npy`` per array (samples first), memory-mapped by
    the reader, which copies one row per sample."""
    import numpy as np

    for i, leaf in enumerate(leaves):
        np.save(out / f"leaf-{i}.npy", leaf)


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
