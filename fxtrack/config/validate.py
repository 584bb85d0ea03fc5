"""A composed config checked before any work starts: unknown keys, values, the architecture and
whether the scenario and framework exist, each reported as one ConfigError naming the key."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util

from omegaconf import DictConfig, OmegaConf

from fxtrack import architectures
from fxtrack.config import schema
from fxtrack.config.schema import FxtrackConfig


class ConfigError(ValueError):
    """A config that cannot run; reported in one line before any work starts."""


class NotSupportedConfig(ConfigError):
    """A valid config its framework has no path for (model=custom): a single run exits 2 with
    the reason; a sweep logs the cell as "not supported" and runs the rest. Carries the typed
    config and architecture for that log."""

    def __init__(self, message: str, conf: FxtrackConfig, arch: architectures.Arch) -> None:
        super().__init__(message)
        self.conf, self.arch = conf, arch


def unknown_keys(cfg: DictConfig) -> None:
    """Raise ConfigError for a key no schema defines (``+batchsize=8``: Hydra's ``+`` adds any
    key), naming the closest valid one."""
    groups = {f.name: f.type for f in dataclasses.fields(FxtrackConfig)}
    nested = {g: {f.name for f in dataclasses.fields(c)} for g, c in schema._GROUP_SCHEMAS.items()}
    nested["framework"] = {f.name for f in dataclasses.fields(  # with the framework's own keys
        schema.framework_schema(str(cfg.framework.get("name", ""))))}
    nested["tracking"] = {f.name for f in dataclasses.fields(schema.TrackingConfig)}
    nested["model"] = {f.name for c in schema._MODEL_SCHEMAS.values()
                       for f in dataclasses.fields(c)}
    valid = set(groups) | {f"{g}.{k}" for g, keys in nested.items() for k in keys}
    for key in cfg:
        names = [key] if key not in nested or not isinstance(cfg[key], DictConfig) else \
            [f"{key}.{k}" for k in cfg[key]]
        for name in names:
            if name not in valid:
                close = difflib.get_close_matches(name, sorted(valid), n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise ConfigError(f"unknown config key {name!r}{hint} (python -m fxtrack --help "
                                  "lists the keys)")


def validate(cfg: DictConfig) -> tuple[FxtrackConfig, architectures.Arch]:
    """Typed, value-checked config and its architecture; raises ConfigError naming the key."""
    unknown_keys(cfg)
    try:
        conf: FxtrackConfig = OmegaConf.to_object(cfg)
        arch = architectures.resolve(conf.model.name, conf.size.name,
                                     **{k: v for k, v in vars(conf.model).items() if k != "name"})
    except Exception as e:  # noqa: BLE001 - omegaconf wraps __post_init__ errors in its own types
        raise ConfigError(str(e).splitlines()[0]) from None
    if conf.scenario.runner is None:
        raise ConfigError(f"scenario={conf.scenario.name} is not implemented yet "
                          "(implemented: scenario=train)")
    if importlib.util.find_spec(conf.framework.package) is None:
        raise ConfigError(f"framework={conf.framework.name} is not implemented yet")
    check_user_model(conf, arch)
    return conf, arch


def check_user_model(conf: FxtrackConfig, arch: architectures.Arch) -> None:
    """model=custom: levers, builder and its module (fxtrack.config.user_model)."""
    from fxtrack.config import user_model

    try:
        user_model.check(conf, arch)
    except user_model.CellNotSupported as e:
        raise NotSupportedConfig(str(e), conf, arch) from None
