"""The one architecture table: every framework reads its model sizes from here.

Canonical sizes follow the papers and the public reference implementations whose trainable
parameter counts docs/contract.md#groups fixes:

- ResNet-50 v1.5 (He et al. 2015, stride 2 on the 3x3 conv of each down-sampling bottleneck as in
  torchvision): 25,557,032 parameters with 1000 classes.
- BERT-base / BERT-large (Devlin et al. 2018) with the masked-LM head whose decoder is tied to the
  word embeddings and no pooler (as Hugging Face's ``BertForMaskedLM``): 109,514,298 / 335,174,458.
- ViT-B/16 and ViT-L/16 (Dosovitskiy et al. 2020, class token, learned position embeddings,
  final LayerNorm, linear head, as timm's ``vit_*_patch16_224``): 86,567,656 / 304,326,632.
- Llama 3.2 1B / Llama 3.1 8B dims (Meta's model cards and configs; Grattafiori et al. 2024):
  pre-norm RMSNorm, RoPE, grouped-query attention, SwiGLU MLP, no biases; the 1B ties its output
  projection to the token embedding, the 8B does not: 1,235,814,400 / 8,030,261,248.

Dropout is 0 everywhere: the benchmark measures the same deterministic function in every
framework (parity tests copy weights across frameworks and compare outputs).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from fxtrack import families
# re-exported: the frameworks' loaders mask as the synthetic batch does
from fxtrack.families.text import BERT_MASK_FRACTION, BERT_MASK_TOKEN, llama_params  # noqa: F401

_LLAMA_TINY = dict(layers=2, hidden=64, heads=4, kv_heads=2, mlp_dim=128, vocab_size=256,
                   seq_len=32)

# model name -> (family, canonical sizes, tiny overrides). ``size=tiny`` keeps widths and
# shrinks depth and input: transformers get 2 layers and 32-pixel images or 16-token
# sequences, ResNet-50 keeps its depth and gets 32-pixel images.
_TABLE: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "resnet50": (
        "resnet",
        dict(image_size=224, num_classes=1000, stage_sizes=(3, 4, 6, 3), width=64),
        dict(image_size=32),
    ),
    "bert": (
        "bert",
        dict(layers=12, hidden=768, heads=12, mlp_dim=3072, seq_len=128, vocab_size=30522,
             max_position=512, type_vocab=2),
        dict(layers=2, seq_len=16),
    ),
    "bert_large": (
        "bert",
        dict(layers=24, hidden=1024, heads=16, mlp_dim=4096, seq_len=128, vocab_size=30522,
             max_position=512, type_vocab=2),
        dict(layers=2, seq_len=16),
    ),
    "vit": (
        "vit",
        dict(image_size=224, patch=16, layers=12, hidden=768, heads=12, mlp_dim=3072,
             num_classes=1000),
        dict(layers=2, image_size=32),
    ),
    "vit_large": (
        "vit",
        dict(image_size=224, patch=16, layers=24, hidden=1024, heads=16, mlp_dim=4096,
             num_classes=1000),
        dict(layers=2, image_size=32),
    ),
    # Decoder LMs. ``size=tiny`` shrinks the widths too (unlike the others): the 1B's embedding
    # alone is 263M parameters, more than a 2-core CI machine can train in seconds.
    "llama": (
        "llama",
        dict(layers=16, hidden=2048, heads=32, kv_heads=8, mlp_dim=8192, vocab_size=128256,
             seq_len=2048, rope_theta=500000.0, norm_eps=1e-5, tied_embeddings=True),
        _LLAMA_TINY,
    ),
    "llama_8b": (
        "llama",
        dict(layers=32, hidden=4096, heads=32, kv_heads=8, mlp_dim=14336, vocab_size=128256,
             seq_len=2048, rope_theta=500000.0, norm_eps=1e-5, tied_embeddings=False),
        _LLAMA_TINY,
    ),
    # A user's own model (model=custom): no sizes, the builder decides. The dims carry what the
    # worker needs to call it: one "package.module:function" per builder key (torch, keras,
    # jax; a framework's declaration names its key), the builder's kwargs, the optimiser, its lr,
    # what kind of model it is (``lm``: measured in tokens along its inputs' ``seq_axis``), and
    # the class names of its sharding units and recomputed blocks (parallel=fsdp, memory=checkpoint).
    "custom": (
        "custom",
        dict(torch=None, keras=None, jax=None, kwargs={}, optimizer="adamw", lr=1e-3,
             kind="plain", seq_axis=1, shard_modules=(), remat_modules=()),
        {},
    ),
}

# Trainable parameters of the canonical models (docs/contract.md#groups); the correctness guard and
# the parity tests compare every framework against these.
PARAM_COUNTS = {
    "resnet50": 25_557_032,
    "bert": 109_514_298,
    "vit": 86_567_656,
    "vit_large": 304_326_632,
    "bert_large": 335_174_458,
    "llama": 1_235_814_400,
    "llama_8b": 8_030_261_248,
}

# How the report names a model in a sentence; another model goes by its name.
DISPLAY_NAMES = {"vit": "ViT-B/16", "resnet50": "ResNet-50", "bert": "BERT-base",
                 "bert_large": "BERT-large", "vit_large": "ViT-L/16", "llama": "Llama (1B dims)",
                 "llama_8b": "Llama (8B dims)"}

CUSTOM = "custom"  # model=custom: a user's model (docs/your-own-model.md)
MODELS = tuple(name for name in _TABLE if name != CUSTOM)  # fxtrack's own architectures
SIZES = ("full", "tiny")

@dataclasses.dataclass(frozen=True)
class Arch:
    """One resolved architecture: a model name, its family, and every size it needs."""

    name: str
    family: str  # a registered family's name (fxtrack.families)
    dims: dict[str, Any]

    def __getattr__(self, key: str) -> Any:
        try:
            return self.__dict__["dims"][key]
        except KeyError:
            raise AttributeError(key) from None

    @property
    def canonical(self) -> bool:
        """True when every size equals the canonical one (the parameter table applies)."""
        return self.name in PARAM_COUNTS and dict(self.dims) == dict(_TABLE[self.name][1])

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "family": self.family,
                "dims": {k: list(v) if isinstance(v, tuple) else v for k, v in self.dims.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Arch":
        dims = {k: tuple(v) if isinstance(v, list) else v for k, v in data["dims"].items()}
        return cls(data["name"], data["family"], dims)


def family(name: str) -> str:
    return _TABLE[name][0]


def spec(name: str) -> Optional[families.Family]:
    """The family spec of model ``name``; None for a name the table does not hold (a run
    logged by another version)."""
    return families.get(_TABLE[name][0]) if name in _TABLE else None


def display_name(name: str) -> str:
    return DISPLAY_NAMES.get(name, name)


def models_where(test: Callable[[families.Family], bool]) -> tuple[str, ...]:
    """The table's models whose family passes ``test``, e.g. the decoder LMs."""
    return tuple(name for name, (fam, _, _) in _TABLE.items() if test(families.get(fam)))


def runs_carry_model_code(name: str) -> bool:
    """Whether model ``name``'s code is measured on each run (``Family.model_code``: a user's
    builder module), not counted once per framework in fxtrack's own source."""
    found = spec(name)
    return found is not None and found.model_code is not None


def size_default(name: str, size: str, key: str) -> Any:
    """The table's value of ``key`` for model ``name`` at ``size`` (``full`` or ``tiny``)."""
    if name not in _TABLE:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join((*MODELS, CUSTOM))}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    _, full, tiny = _TABLE[name]
    return tiny.get(key, full[key]) if size == "tiny" else full[key]


def resolve(name: str, size: str = "full", **overrides: Any) -> Arch:
    """The architecture of ``name`` at ``size``, with explicit overrides applied and checked."""
    fam, full, _ = _TABLE[name]
    dims = {key: size_default(name, size, key) for key in full}
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in dims and key not in families.get(fam).data_keys:
            raise ValueError(f"model {name!r} has no size {key!r}")
        dims[key] = value
    _check(name, fam, dims)
    return Arch(name, fam, dims)


def _check(name: str, fam: str, d: dict[str, Any]) -> None:
    for key, value in d.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
            raise ValueError(f"model.{key} must be positive, got {value}")
    families.get(fam).check(name, d)
