"""``Family``, the spec of a model family, and the registry that holds one per name."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

Arch = Any  # fxtrack.architectures.Arch, which imports this package

# Optimisers, the same in every framework: SGD with Nesterov-free momentum and decoupled-from-
# nothing L2 weight decay for ResNet-50 (Goyal et al. 2017), AdamW for the transformers.
SGD = dict(lr=0.1, momentum=0.9, weight_decay=1e-4)  # lr for a global batch of 256
ADAMW = dict(lr=1e-4, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)


def sgd_lr(global_batch: int) -> float:
    """The linear scaling rule (Goyal et al. 2017): 0.1 per 256 images. Without it a small
    CPU batch at lr 0.1 makes BatchNorm'd ResNet-50 diverge within a few steps."""
    return SGD["lr"] * global_batch / 256


def adamw(arch: "Arch", global_batch: int) -> tuple[str, float]:
    return "adamw", ADAMW["lr"]


def _no_check(name: str, dims: dict[str, Any]) -> None:
    return None


def _never(arch: "Arch") -> bool:
    return False


def _always(arch: "Arch") -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Family:
    """What shared code may ask about a model family. Optional parts are ``None`` where the
    family has none (a user's model has no synthetic batch: its builder makes its data)."""

    name: str
    # model.<key> a user may override on the command line (docs/contract.md#keys); the schema
    # (fxtrack.config.schema) gives each an int field defaulting to the architecture table
    size_keys: tuple[str, ...] = ()
    check: Callable[[str, dict[str, Any]], None] = _no_check  # (model, dims): raise ValueError
    # (rng, arch, batch) -> NumPy arrays every framework copies (fxtrack.data.synthetic)
    batch: Optional[Callable[[Any, "Arch", int], dict[str, Any]]] = None
    describe: Optional[Callable[["Arch", int], dict[str, dict[str, Any]]]] = None  # shapes, dtypes
    forward_flops: Optional[Callable[["Arch"], int]] = None  # per sample; None: the framework counts
    generate_flops: Optional[Callable[["Arch", int, int], int]] = None  # (arch, prompt, new tokens)
    dataset: Optional[str] = None  # scenario=pipeline's files: a format of fxtrack.data.on_disk
    params: Optional[Callable[["Arch"], int]] = None  # from the dims; None: the canonical table's
    # Memory beyond the state (fxtrack.config.memory): (arch, phase, batch, bytes per value,
    # memory lever, prompt_len, new_tokens) -> {part: bytes}; phase: train | forward | decode
    activations: Optional[Callable[..., dict[str, float]]] = None
    memory_note: str = ""  # what the estimate assumes, for the refusal's line
    optimizer: Callable[["Arch", int], tuple[str, float]] = adamw  # (arch, global batch) -> (kind, lr)
    generates: bool = False  # a decoder LM: scenario=generate, serve decodes tokens
    seq_len_search: bool = False  # scenario=fit may search model.seq_len
    is_lm: Callable[["Arch"], bool] = _never  # its rate is read in tokens/s (tokens_per_s)
    # its (first) output is a score vector, logits over the last axis: a deployment run measures
    # top-1 agreement there (and requires it for int8); False: any values, the error bound alone
    scores: Callable[["Arch"], bool] = _always
    # A model a builder makes (model=custom) answers these itself; None: fxtrack's own model.
    # Parts that live in the config layer are "module:function" strings, imported where used,
    # so this package imports nothing above it.
    config_schema: Optional[str] = None  # "module:Class" of model.*; None: its size keys
    config_check: Optional[str] = None  # (conf, arch) -> why the cell cannot run, or None
    # (conf, arch) -> (parameters, why not): counted from a shape-only build, as there is no
    # table or formula to read them from
    abstract_count: Optional[str] = None
    resizable: bool = True  # size= and model.<key> make it smaller (False: only its own kwargs)
    # (dims, builder key) -> the "module:function" whose module is the model's code: measured
    # per run (fxtrack's own code is counted once per framework)
    model_code: Optional[Callable[[dict[str, Any], str], str]] = None
    # (dims, builder key, name) -> the model as a run's name says it (``custom[build_t5]``)
    run_label: Optional[Callable[[dict[str, Any], str, str], str]] = None
    # (dims, the table's dims) -> the dims a run's name shows; None: the size keys set apart
    dims_shown: Optional[Callable[[dict[str, Any], dict[str, Any]], dict[str, str]]] = None
    # the framework capability that builds, runs, exports and counts the FLOPs of its model
    # (a user's: ``user_model``, its serving export); None: fxtrack's own builders
    builder_capability: Optional[str] = None
    # its data may be random (nothing to learn in a few steps): a loss that does not fall is a
    # warning tag, not a failed guard
    flat_loss_warns: bool = False
    # Real data (data=<name>, fxtrack.data): (its Split) -> the dims the data sets (input
    # shape, classes, vocabulary); raises ValueError, one line, where the family cannot take
    # it; None: the family trains on synthetic data only
    data_dims: Optional[Callable[[Any], dict[str, Any]]] = None
    # dims only data sets, absent from the architecture table (and so from model.*, run names
    # and every model without them): the ViT's ``image_height`` for a one-row signal
    data_keys: tuple[str, ...] = ()
    # (windows (B, seq_len + 1) int32 of a byte corpus, one seed per row) -> the family's batch
    # on them (fxtrack.data.batch: the family decides its form); None: no byte corpus
    corpus_batch: Optional[Callable[[Any, list], dict[str, Any]]] = None
    # scenario.metric values its held-out evaluation has a figure for; the first is the default
    converge_metrics: tuple[str, ...] = ("accuracy", "loss")
    # scenario=converge's defaults per dataset (metric, target, budget, the dims of the
    # reference runs that set them: fxtrack.families.quality); empty: none declared
    quality: dict[str, Any] = dataclasses.field(default_factory=dict)


_REGISTRY: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add ``family`` (replacing one of its name): the one way a family joins."""
    _REGISTRY[family.name] = family
    return family


def get(name: str) -> Family:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; registered: {', '.join(_REGISTRY)}") from None


def of(arch: Any) -> Family:
    """The spec of an ``Arch`` or of its JSON form (a JobSpec's ``arch``)."""
    return get(arch["family"] if isinstance(arch, dict) else arch.family)


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)
