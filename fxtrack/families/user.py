"""model=custom: a user's own model (docs/your-own-model.md). Its spec reads the user's
declaration in the dims: ``model.kind=lm`` makes it a language model (tokens/s), and
``model.optimizer`` / ``model.lr`` its optimiser. No synthetic batch, FLOP formula or parameter
formula: its builder makes its data, its framework counts FLOPs and parameters."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from fxtrack.families.spec import Family, Model

Arch = Any  # fxtrack.architectures.Arch, which imports this package


@dataclasses.dataclass(frozen=True)
class UserModel:
    """What a model a builder makes answers itself, where fxtrack's own models have a table or
    a formula (``Family.user``). It has no sizes fxtrack could change (``size=`` and
    ``model.<key>`` leave it as built) and its data may be random, so a loss that does not fall
    is a warning tag, not a failed guard. Parts that live in the config layer are
    "module:function" strings, imported where used, so this package imports nothing above it."""

    # the framework capability that builds, runs, exports and counts the FLOPs of its model
    # (and, with ``user_`` before another capability's name, its serving export and so on)
    builder_capability: str
    config_schema: str  # "module:Class" of model.*
    config_check: str  # (conf, arch) -> why the cell cannot run, or None
    # (conf, arch) -> (parameters, why not): counted from a shape-only build, as there is no
    # table or formula to read them from
    abstract_count: str
    # (dims, builder key) -> the "module:function" whose module is the model's code: measured
    # per run (fxtrack's own code is counted once per framework)
    model_code: Callable[[dict[str, Any], str], str]
    # (dims, builder key, name) -> the model as a run's name says it (``custom[build_t5]``)
    run_label: Callable[[dict[str, Any], str, str], str]
    # (dims, the declared dims) -> the dims a run's name shows
    dims_shown: Callable[[dict[str, Any], dict[str, Any]], dict[str, str]]


OPTIMIZERS = ("adamw", "sgd")  # model.optimizer: built as for fxtrack's own models


def _declared_optimizer(arch: "Arch", global_batch: int) -> tuple[str, float]:
    """(``adamw`` | ``sgd``, learning rate) of a user's model: its ``model.optimizer``,
    ``model.lr`` (the schema refuses another optimiser before any work; a backstop here)."""
    if arch.optimizer not in OPTIMIZERS:
        raise ValueError(f"model.optimizer must be one of {', '.join(OPTIMIZERS)}, "
                         f"got {arch.optimizer!r}")
    return arch.optimizer, float(arch.lr)


def _plain(value: Any) -> str:
    return "x".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _run_label(dims: dict[str, Any], builder_key: str, name: str) -> str:
    """``custom[build_t5]``: the function this framework's builder names, once."""
    builder = dims.get(builder_key) or ""
    return f"custom[{str(builder).rpartition(':')[2]}]" if builder else name


# what a run's name shows of a user's model besides its builder: a plain model and an LM of
# one builder are two configs, so kind shows where it is not the default
_SHOWN = ("optimizer", "lr", "kind", "seq_axis", "shard_modules", "remat_modules")


def _dims_shown(dims: dict[str, Any], default: dict[str, Any]) -> dict[str, str]:
    """The declarations set apart from the defaults, then the builder's kwargs."""
    shown = {k: _plain(v) for k, v in dims.items()
             if k in _SHOWN and _plain(default.get(k)) != _plain(v)}
    return {**shown, **{k: _plain(v) for k, v in dict(dims.get("kwargs") or {}).items()}}


def _is_lm(arch: "Arch") -> bool:
    return arch.dims.get("kind") == "lm"


# No sizes: the builder decides. The dims carry what the worker needs to call it: one
# "package.module:function" per builder key (torch, keras, jax; a framework's declaration names
# its key), the builder's kwargs, the optimiser, its lr, what kind of model it is (``lm``:
# measured in tokens along its inputs' ``seq_axis``), and the class names of its sharding units
# and recomputed blocks (parallel=fsdp, memory=checkpoint).
MODEL = Model("custom", dict(torch=None, keras=None, jax=None, kwargs={}, optimizer="adamw",
                             lr=1e-3, kind="plain", seq_axis=1, shard_modules=(),
                             remat_modules=()),
              gpu=(32, 50, 10), cpu=(8, 10, 2))

# a plain model's outputs may be any values (a regression): its deployment outputs are held to
# the error bound alone; an LM's are logits, scored by top-1 agreement too
CUSTOM = Family("custom", optimizer=_declared_optimizer, is_lm=_is_lm, scores=_is_lm,
                user=UserModel(builder_capability="user_model",
                               config_schema="fxtrack.config.schema:CustomConfig",
                               config_check="fxtrack.config.user_model:refusal",
                               abstract_count="fxtrack.config.user_model:abstract_param_count",
                               model_code=lambda dims, key: dims[key], run_label=_run_label,
                               dims_shown=_dims_shown),
                models=(MODEL,))
