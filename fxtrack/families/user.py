"""model=custom: a user's own model (docs/your-own-model.md). Its spec reads the user's
declaration in the dims: ``model.kind=lm`` makes it a language model (tokens/s), and
``model.optimizer`` / ``model.lr`` its optimiser. No synthetic batch, FLOP formula or parameter
formula: its builder makes its data, its framework counts FLOPs and parameters."""

from __future__ import annotations

from typing import Any

from fxtrack.families.spec import Family

Arch = Any  # fxtrack.architectures.Arch, which imports this package


OPTIMIZERS = ("adamw", "sgd")  # model.optimizer: built as for fxtrack's own models


def _declared_optimizer(arch: "Arch", global_batch: int) -> tuple[str, float]:
    """(``adamw`` | ``sgd``, learning rate) of a user's model: its ``model.optimizer``,
    ``model.lr`` (the schema refuses another optimiser before any work; a backstop here)."""
    if arch.optimizer not in OPTIMIZERS:
        raise ValueError(f"model.optimizer must be one of {', '.join(OPTIMIZERS)}, "
                         f"got {arch.optimizer!r}")
    return arch.optimizer, float(arch.lr)


CUSTOM = Family("custom", optimizer=_declared_optimizer, user_model=True,
                is_lm=lambda a: a.dims.get("kind") == "lm")
