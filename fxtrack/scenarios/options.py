"""What every scenario's typed options (``scenario.<key>``) share: the ``Options`` base and the
checks its fields go through. Each scenario's own dataclass, each option and its default written
once, is in its folder's ``__init__`` (``fxtrack.scenarios.serve.ServeOptions``). The config layer registers them in Hydra's ConfigStore as
``scenario/<name>`` (``fxtrack.config.schema.register``), so a typo or a wrong type fails while
Hydra composes; ``__post_init__`` checks the values (NaN and inf included) when the orchestrator
turns the composed config into objects, and again when the worker reads its JobSpec.

Plain dataclasses: no Hydra, no OmegaConf, no framework (the worker reads them too).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


def finite(owner: str, **values: Any) -> None:
    """The one check every numeric option goes through (a number given as text too): NaN and
    inf pass every ``value <= 0`` refusal (a NaN timeout_s turned the watchdog off, issue 43)."""
    for key, value in values.items():
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                continue  # a word ("search"): the option's own check says what it takes
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{owner}{key} must be a finite number, got {value}")


def finite_fields(owner: str, obj: Any) -> None:
    """``finite`` over every field of a dataclass instance: a new float key is covered too."""
    finite(owner, **{f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})


def positive(owner: str, **values: Any) -> None:
    """Raise ValueError unless each value that is set is a finite number above 0."""
    finite(owner, **values)
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{owner}{key} must be a number, got {value!r}")
        if value <= 0:
            raise ValueError(f"{owner}{key} must be a positive number, got {value}")


def at_least(owner: str, floor: float, **values: Any) -> None:
    """Raise ValueError unless each value that is set is finite and >= ``floor``."""
    finite(owner, **values)
    for key, value in values.items():
        if value is not None and value < floor:
            raise ValueError(f"{owner}{key} must be >= {floor:g}, got {value}")


# A config field's metadata key: every key a run logs is part of its identity (which runs are
# one experiment, fxtrack.report.identity) unless its field says why not, with ``apart``.
IDENTITY = "identity"


def apart(why: str, **field: Any) -> Any:
    """A dataclass field kept out of a run's identity, with the reason beside the key."""
    return dataclasses.field(metadata={IDENTITY: why}, **field)


def apart_keys(cls: type, prefix: str = "") -> dict[str, str]:
    """``prefix + key`` -> why, for the fields of ``cls`` declared ``apart``."""
    return {prefix + f.name: f.metadata[IDENTITY] for f in dataclasses.fields(cls)
            if f.metadata.get(IDENTITY)}


def apart_from_identity() -> dict[str, str]:
    """``scenario.<key>`` -> why, of every option of every scenario declared apart."""
    found, todo = {}, [Options]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        found.update(apart_keys(cls, "scenario."))
    return found


@dataclasses.dataclass
class Options:
    """What every scenario's options have: the scenario's name (``scenario=<name>``)."""

    name: str = ""

    def __post_init__(self) -> None:  # every subclass's numeric option, present and future
        finite_fields("scenario.", self)


def defaults(cls: type, prefix: str = "scenario.") -> dict[str, Any]:
    """Each option of ``cls`` as its dotted key (``scenario.slo.e2e_ms``: a nested dataclass's
    keys included) with its default; the scenario's name left out."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name == "name":
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out.update(defaults(type(default), f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = default
    return out


def from_json(cls: type, values: Any) -> Options:
    """``cls`` from a JobSpec's options (a dict read back from JSON, or already ``cls``); keys
    ``cls`` does not have are an error, so that a misspelt option never silently defaults."""
    if isinstance(values, cls):
        return values
    if isinstance(values, Options):  # another scenario's (a spec reused for a new scenario):
        # its options at their defaults are not asked for; one set is still refused below
        unset = defaults(type(values), "")
        values = {k: v for k, v in dataclasses.asdict(values).items()
                  if k != "name" and (k not in unset or v != unset[k])}
    values = dict(values or {})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"scenario={values.get('name', cls.name)} has no option "
                         f"{unknown[0]!r} (options: {', '.join(sorted(names - {'name'}))})")
    values.setdefault("name", cls.name)
    return cls(**values)
