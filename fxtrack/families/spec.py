"""``Family``, the spec of a model family, and the registry that holds one per name."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

Arch = Any  # fxtrack.architectures.Arch, which imports this package
UserModel = Any  # fxtrack.families.user.UserModel, which imports this module

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
class Model:
    """One named size of a family (torchtitan's flavour), chosen as ``model=<name>``: its
    canonical dims, what ``size=tiny`` changes, its per-device defaults and how the report names
    it. Its config node (``conf``'s ``model/<name>``) is registered from here
    (``fxtrack.config.schema.register``)."""

    name: str
    dims: dict[str, Any]  # the canonical sizes (the papers': see the family's module)
    # (per-device batch, timed steps, warm-up steps) for ``batch_size``, ``steps`` and
    # ``warmup_steps`` left null, on a GPU and on a CPU
    gpu: tuple[int, int, int]
    cpu: tuple[int, int, int]
    tiny: dict[str, Any] = dataclasses.field(default_factory=dict)  # size=tiny's overrides
    # trainable parameters at the canonical dims (docs/contract.md#groups): the correctness
    # guard and the parity tests hold every framework to it; None: none fixed
    params: Optional[int] = None
    display: Optional[str] = None  # how a sentence names it; None: its name


@dataclasses.dataclass(frozen=True)
class Family:
    """What shared code may ask about a model family. Optional parts are ``None`` where the
    family has none (a user's model has no synthetic batch: its builder makes its data)."""

    name: str
    # model.<key> a user may override on the command line (docs/contract.md#keys); the schema
    # (fxtrack.config.schema) gives each an int field defaulting to its model's declared dims
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
    # a model a builder makes (model=custom) answers what fxtrack cannot (its config, its
    # parameters, its code): fxtrack.families.user.UserModel; None: fxtrack's own models
    user: Optional[UserModel] = None
    # Real data (data=<name>, fxtrack.data): (its Split) -> the dims the data sets (input
    # shape, classes, vocabulary); raises ValueError, one line, where the family cannot take
    # it; None: the family trains on synthetic data only
    data_dims: Optional[Callable[[Any], dict[str, Any]]] = None
    # dims only data sets, absent from every ``Model``'s dims (and so from model.*, run names
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
    # (arch) -> the tokens per sample its attention layers see (a run's attention tag);
    # None: no attention
    attention_tokens: Optional[Callable[["Arch"], int]] = None
    # its named sizes, model=<name> each
    models: tuple[Model, ...] = ()


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


def models() -> dict[str, tuple[Family, Model]]:
    """Every registered family's models by name, with their family (read from the registry each
    time: a family registered later brings its models)."""
    return {model.name: (family, model) for family in _REGISTRY.values()
            for model in family.models}
