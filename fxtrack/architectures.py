"""The one accessor of model sizes: every framework and shared layer reads a model's dims, its
parameter count, display name and per-device defaults here, from the family records
(``fxtrack.families``: each family's module declares its models). No table of its own.

Dropout is 0 everywhere: the benchmark measures the same deterministic function in every
framework (parity tests copy weights across frameworks and compare outputs).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from fxtrack import families
# re-exported: the frameworks' loaders mask as the synthetic batch does
from fxtrack.families.text import BERT_MASK_FRACTION, BERT_MASK_TOKEN, llama_params  # noqa: F401

CUSTOM = "custom"  # model=custom: a user's model (docs/your-own-model.md)
SIZES = ("full", "tiny")


def _model(name: str) -> tuple[families.Family, families.Model]:
    found = families.models()
    if name not in found:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(found)}")
    return found[name]


def models() -> tuple[str, ...]:
    """fxtrack's own models, every registered family's (a user's model=custom apart)."""
    return tuple(name for name, (fam, _) in families.models().items() if fam.user is None)


def param_count(name: str) -> Optional[int]:
    """Trainable parameters of model ``name`` at its canonical dims (docs/contract.md#groups);
    None where none is fixed."""
    found = families.models().get(name)
    return found[1].params if found else None


def run_defaults(name: str, device_kind: str, batch_size: Optional[int], steps: Optional[int],
                 warmup_steps: Optional[int]) -> tuple[int, int, int]:
    """Fill the ``None`` among (batch_size, steps, warmup_steps) from model ``name``'s defaults
    for this device kind (``warmup_steps=0`` stays 0: the first timed step then gives
    first_step_time_s)."""
    model = _model(name)[1]
    batch, n, warm = model.gpu if device_kind == "gpu" else model.cpu
    return batch_size or batch, steps or n, warm if warmup_steps is None else warmup_steps


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
        found = families.models().get(self.name)
        return (found is not None and found[1].params is not None
                and dict(self.dims) == dict(found[1].dims))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "family": self.family,
                "dims": {k: list(v) if isinstance(v, tuple) else v for k, v in self.dims.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Arch":
        dims = {k: tuple(v) if isinstance(v, list) else v for k, v in data["dims"].items()}
        return cls(data["name"], data["family"], dims)


def family(name: str) -> str:
    return _model(name)[0].name


def spec(name: str) -> Optional[families.Family]:
    """The family spec of model ``name``; None for a name no family declares (a run logged by
    another version)."""
    found = families.models().get(name)
    return found[0] if found else None


def display_name(name: str) -> str:
    found = families.models().get(name)
    return (found[1].display if found else None) or name


def models_where(test: Callable[[families.Family], bool]) -> tuple[str, ...]:
    """The declared models whose family passes ``test``, e.g. the decoder LMs."""
    return tuple(name for name, (fam, _) in families.models().items() if test(fam))


def runs_carry_model_code(name: str) -> bool:
    """Whether model ``name``'s code is measured on each run (``UserModel.model_code``: a
    user's builder module), not counted once per framework in fxtrack's own source."""
    found = spec(name)
    return found is not None and found.user is not None


def size_default(name: str, size: str, key: str) -> Any:
    """Model ``name``'s value of ``key`` at ``size`` (``full`` or ``tiny``)."""
    model = _model(name)[1]
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    return model.tiny.get(key, model.dims[key]) if size == "tiny" else model.dims[key]


def resolve(name: str, size: str = "full", **overrides: Any) -> Arch:
    """The architecture of ``name`` at ``size``, with explicit overrides applied and checked."""
    fam, model = _model(name)
    dims = {key: size_default(name, size, key) for key in model.dims}
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in dims and key not in fam.data_keys:
            raise ValueError(f"model {name!r} has no size {key!r}")
        dims[key] = value
    _check(name, fam, dims)
    return Arch(name, fam.name, dims)


def _check(name: str, fam: families.Family, d: dict[str, Any]) -> None:
    for key, value in d.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
            raise ValueError(f"model.{key} must be positive, got {value}")
    fam.check(name, d)
