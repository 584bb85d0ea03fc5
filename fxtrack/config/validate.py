"""A composed config checked before any work starts: unknown keys, values, the architecture,
whether the scenario and framework exist, each reported as one ConfigError naming the key; and
whether the combination has a path (``fxtrack.scenarios.rules``): a ``Refused`` config."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import os
from pathlib import Path
from typing import Iterable, Optional

from omegaconf import DictConfig, OmegaConf, open_dict

from fxtrack import architectures, families
from fxtrack.config import schema
from fxtrack.config.frameworks import declared
from fxtrack.config.schema import FxtrackConfig
from fxtrack.frameworks.declaration import import_path
from fxtrack import scenarios
from fxtrack.scenarios import rules


class ConfigError(ValueError):
    """A config that cannot run; reported in one line before any work starts."""


class Refused(ConfigError):
    """A valid config that has no path (``framework=tensorflow parallel=fsdp``): a single run
    stops, a sweep skips the cell as not supported. Carries the checked config and its
    architecture, so that the cell can be named like the runs."""

    headline = "not supported"  # how a single run's refusal starts (orchestrator.app)

    def __init__(self, why: str, conf: FxtrackConfig, arch: architectures.Arch) -> None:
        super().__init__(why)
        self.conf, self.arch = conf, arch


class WontFit(Refused):
    """A config whose run cannot fit the device's memory (``fxtrack.config.memory``): refused
    like a combination without a path, so that a sweep skips the cell."""

    headline = "will not fit in memory"


def valid_keys(frameworks: Iterable[str]) -> set[str]:
    """Every key the schema defines, ``group.key`` included, with the own keys of
    ``frameworks`` (``framework.<setting>``)."""
    groups = {f.name for f in dataclasses.fields(FxtrackConfig)}
    nested = {g: {f.name for f in dataclasses.fields(c)} for g, c in schema._GROUP_SCHEMAS.items()}
    nested["framework"] = {f.name for name in frameworks
                           for f in dataclasses.fields(schema.framework_schema(name))}
    nested["tracking"] = {f.name for f in dataclasses.fields(schema.TrackingConfig)}
    nested["model"] = {f.name for c in schema.model_schemas().values()
                       for f in dataclasses.fields(c)}
    return groups | {f"{g}.{k}" for g, keys in nested.items() for k in keys} | scenario_keys()


def scenario_keys() -> set[str]:
    """``scenario.<option>`` of every registered scenario, a nested dataclass's keys included
    (``scenario.slo.e2e_ms``), and ``scenario.name``."""
    from fxtrack.scenarios.options import defaults

    return {"scenario.name"} | {key for s in scenarios.SCENARIOS.values()
                                for key in defaults(s.options)}


def open_prefixes() -> set[str]:
    """Keys that take any sub-key (a dict field, e.g. model=custom's ``model.kwargs.width``)."""
    return {f"model.{f.name}." for c in schema.model_schemas().values()
            for f in dataclasses.fields(c) if "dict" in str(f.type).lower()}


def unknown_key(name: str, valid: set[str]) -> ConfigError:
    """The error for a key no schema defines, naming the closest valid one."""
    close = difflib.get_close_matches(name, sorted(valid), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    return ConfigError(f"unknown config key {name!r}{hint} (python -m fxtrack --help lists the "
                       "keys)")


def unknown_keys(cfg: DictConfig) -> None:
    """Raise ConfigError for a key no schema defines (``+batchsize=8``: Hydra's ``+`` adds any
    key), naming the closest valid one. The one key check: an override of such a key without
    ``+`` stops Hydra's composition, whose error ``composition_error`` words the same way."""
    valid = valid_keys([str(cfg.framework.get("name", ""))])
    nested = {key.rpartition(".")[0] for key in valid if "." in key}  # e.g. scenario.slo too
    nested |= {key.partition(".")[0] for key in valid if "." in key}

    def names(prefix: str, node: DictConfig) -> list[str]:
        out = []
        for k in node:
            name = f"{prefix}{k}"
            if name in nested and isinstance(node[k], DictConfig):
                out += names(f"{name}.", node[k])
            else:
                out.append(name)
        return out

    for name in names("", cfg):
        if name not in valid:
            raise unknown_key(name, valid)


@functools.lru_cache(maxsize=None)
def expected_device_kind(hardware: str) -> Optional[str]:
    """The device kind a run will use, as far as it can be known without starting a framework:
    ``hardware=cpu|gpu`` as given; ``auto`` is ``cpu`` where no NVIDIA GPU is visible (no NVML
    device, or CUDA_VISIBLE_DEVICES empty), else None (the framework may still not see it: the
    rules about the device kind are then the worker's)."""
    if hardware in ("cpu", "gpu"):
        return hardware
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return "cpu"
    try:
        import pynvml  # nvidia-ml-py: a thin ctypes binding, no framework
    except ImportError:
        return None if os.path.exists("/proc/driver/nvidia") else "cpu"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver: no NVIDIA GPU any framework could use
        return "cpu"
    try:
        return None if pynvml.nvmlDeviceGetCount() > 0 else "cpu"
    finally:
        pynvml.nvmlShutdown()


def refusal(conf: FxtrackConfig, arch: architectures.Arch) -> Optional[str]:
    """Why ``conf`` has no path, from the frameworks' declarations and the neutral rules."""
    c = rules.Combination(
        framework=conf.framework.name, scenario=conf.scenario.name,
        precision=conf.precision.name, parallel=conf.parallel.value, memory=conf.memory.value,
        runtime=conf.runtime.value, quantize=conf.quantize.value, devices=conf.devices,
        nodes=conf.hardware.nodes, device_kind=expected_device_kind(conf.hardware.name),
        family=arch.family, options_set=scenarios.options_set(conf.scenario.name, conf.scenario))
    framework = declared().get(conf.framework.name)
    return None if framework is None else rules.refusal(c, framework)


def owners(key: str) -> list[str]:
    """The registered scenarios that have the option ``key``."""
    return [s.name for s in scenarios.SCENARIOS.values()
            if key in {f.name for f in dataclasses.fields(s.options)}]


def drop_other_scenarios_keys(cfg: DictConfig, sweep: bool) -> None:
    """Keys of another scenario's options (``scenario.rate`` with scenario=train): one line
    naming whose option it is; in a sweep's job (``sweep``) they are dropped, since a sweep
    across scenarios sets each option for the jobs whose scenario has it (the sweep checks
    that one does: ``fxtrack.orchestrator.sweep``)."""
    name = cfg.scenario.name
    own = {f.name for f in dataclasses.fields(scenarios.get(name).options)}
    extra = [k for k in cfg.scenario if k not in own]
    for key in extra:
        if not sweep:
            raise ConfigError(f"scenario.{key} is an option of scenario="
                              f"{'/'.join(owners(key))}, not of scenario={name}")
    with open_dict(cfg.scenario):
        for key in extra:
            del cfg.scenario[key]


def validate(cfg: DictConfig, sweep: bool = False) -> tuple[FxtrackConfig, architectures.Arch]:
    """Typed, value-checked config and its architecture; raises ConfigError naming the key.
    ``sweep``: a sweep's job, which drops the keys of other scenarios' options."""
    unknown_keys(cfg)
    drop_other_scenarios_keys(cfg, sweep)
    try:
        conf: FxtrackConfig = OmegaConf.to_object(cfg)
    except Exception as e:  # noqa: BLE001 - omegaconf wraps __post_init__ errors in its own types
        raise ConfigError(str(e).splitlines()[0]) from None
    scenario = scenarios.get(conf.scenario.name)
    dims = data_dims(conf, scenario)  # real data sets the input shape, classes, vocabulary
    try:
        arch = architectures.resolve(conf.model.name, conf.size.name, **{
            **{k: v for k, v in vars(conf.model).items() if k not in ("name", "from_run")},
            **dims})
    except ValueError as e:
        where = f"data={conf.data.name} sets {dims}: " if dims else ""
        declared = families.get(architectures.family(conf.model.name)).quality.get(conf.data.name)
        hint = "" if not dims or declared is None else (
            "; the reference runs' dims: " + " ".join(f"model.{k}={v}"
                                                     for k, v in declared.dims.items()))
        raise ConfigError(where + str(e).splitlines()[0] + hint) from None
    if not scenario.implemented:
        raise ConfigError(f"scenario={scenario.name} is not implemented yet (implemented: "
                          f"{', '.join(scenarios.where(implemented=True))})")
    if importlib.util.find_spec(conf.framework.package) is None:
        raise ConfigError(f"framework={conf.framework.name} is not implemented yet")
    # bad scenario input the options alone cannot see, one line, before any work
    why = scenario.refusal(conf.scenario, families.of(arch), conf.batch_size)
    if why is not None:
        raise ConfigError(why)
    why = refusal(conf, arch) or family_refusal(conf, arch) or runtime_refusal(conf)
    if why is not None:
        raise Refused(why, conf, arch)
    check = scenario.part("check")
    if check is not None:  # e.g. fit's budget: the search finds what fits
        why = check(conf, arch)
        if why is not None:
            raise ConfigError(why)
    if not scenario.memory_floor:
        return conf, arch
    why = memory_refusal(conf, arch)
    if why is not None:
        raise WontFit(why, conf, arch)
    return conf, arch


def data_dims(conf: FxtrackConfig, scenario: scenarios.Scenario) -> dict:
    """The dims real data sets (``Family.data_dims``: input shape, classes, vocabulary), once
    the data is read and checked (fxtrack.data); ConfigError, one line, for data that cannot be
    used, a scenario that does not read it, or a shape the family cannot take."""
    from fxtrack import data

    name = conf.data.name
    if name == data.SYNTHETIC:
        if scenario.real_data:
            raise ConfigError(f"scenario={scenario.name} trains on real data: add data=mnist, "
                              "data=pycode or data=file data.path=FILE")
        return {}
    if not scenario.real_data and not getattr(conf.model, "from_run", None):
        raise ConfigError(f"data={name} is read by scenario="
                          f"{'/'.join(scenarios.where(real_data=True))}; "
                          f"scenario={scenario.name} times synthetic batches: drop data={name}")
    family = families.get(architectures.family(conf.model.name))
    try:
        split = data.load(conf.data)
        if family.data_dims is None:
            raise data.DataError(f"model={conf.model.name} trains on synthetic data only")
        return family.data_dims(split)
    except ValueError as e:  # DataError included
        why = str(e).splitlines()[0]
        raise ConfigError(why if why.startswith("data") else f"data={name}: {why}") from None


def output_dir_refusal(args: list[str], cwd: str) -> Optional[str]:
    """Why Hydra cannot make this run's output directory (``hydra.run.dir``, a sweep's
    ``hydra.sweep.dir``: under the launch directory unless set), one line, or None: checked
    before Hydra starts, since a sweep logs its parent run before Hydra makes the directory."""
    if any(a in ("--cfg", "-c", "--info", "-i", "--hydra-help", "--shell-completion", "-sc")
           for a in args):
        return None  # Hydra only prints: it makes no directory
    multirun = any(a in ("-m", "--multirun") for a in args)
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = next((a.partition("=")[2] for a in args if a.lstrip("+").startswith(key + "=")),
                 None)
    # the part before any interpolation (outputs/${now:...}); the rest is made later
    static = (given if given is not None else "multirun" if multirun else "outputs").split(
        "${", 1)[0]
    path = Path(cwd, static)
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    if not path.is_dir():
        return (f"{path} is not a directory, and Hydra writes the run's outputs under it; move "
                f"it away, run from another directory, or set {key}=DIR")
    if not os.access(path, os.W_OK | os.X_OK):
        readonly = hasattr(os, "statvfs") and os.statvfs(path).f_flag & os.ST_RDONLY
        why = "on a read-only file system" if readonly else "not writable"
        store = "" if given is not None else " and tracking.uri (the default store is ./mlflow.db)"
        return (f"{path} is {why}, and Hydra writes the run's outputs under it; run from a "
                f"writable directory (cd), or set {key}=DIR{store}")
    return None


def output_dir_error(e: OSError, cwd: str) -> str:
    """One line for an OSError raised before the job started: Hydra making its output
    directory or writing its files there (``.hydra/``, the job's log)."""
    where = f"{e.strerror or type(e).__name__}: {e.filename!r}" if e.filename else str(e)
    return (f"cannot write the run's outputs in {cwd} ({where}); run from a writable directory "
            "(cd), or set hydra.run.dir=DIR (a sweep: hydra.sweep.dir=DIR)")


def runtime_refusal(conf: FxtrackConfig) -> Optional[str]:
    """A deployment runtime whose package this interpreter lacks, before the model is built
    (a worker on another interpreter, ``framework.python``, finds out in its own import)."""
    from fxtrack.runtimes import unavailable

    runtime = getattr(conf.runtime, "value", conf.runtime)
    return None if conf.framework.python else unavailable(str(runtime))


def memory_refusal(conf: FxtrackConfig, arch: architectures.Arch) -> Optional[str]:
    """Why the run cannot fit its device's memory, from the model's declared dims (model=custom:
    from a shape-only build of the user's model in a short worker), or None."""
    from fxtrack.config import memory

    s = conf.scenario
    user = families.of(arch).user  # a built model: a shape-only build counts its parameters
    count = None if user is None else (lambda: import_path(user.abstract_count)(conf, arch))
    return memory.refusal(
        arch, s.name, conf.precision.name, conf.batch_size,
        expected_device_kind(conf.hardware.name), devices=conf.devices,
        nodes=conf.hardware.nodes, parallel=conf.parallel.value, memory=conf.memory.value,
        size=conf.size.name, count=count,
        # a decoding scenario's prompt and output lengths (its KV cache); 0: none
        prompt_len=getattr(s, "prompt_len", 0), new_tokens=getattr(s, "new_tokens", 0))


def family_refusal(conf: FxtrackConfig, arch: architectures.Arch) -> Optional[str]:
    """A built model's own check of the cell (``UserModel.config_check``; model=custom: levers,
    builder unset, module not importable), one line, or None."""
    user = families.of(arch).user
    return None if user is None else import_path(user.config_check)(conf, arch)


def composition_error(e: BaseException) -> Optional[str]:
    """One line for an error Hydra or OmegaConf raised while composing the config (an unknown
    option lists the options, an unknown key gets unknown_keys' did-you-mean); None for any
    other exception. The command line's and a sweep's jobs' (orchestrator.sweep) alike."""
    from hydra.errors import (
        ConfigCompositionException,
        HydraException,
        MissingConfigException,
        OverrideParseException,
    )
    from omegaconf.errors import OmegaConfBaseException

    if not isinstance(e, (HydraException, OmegaConfBaseException)):
        return None
    if isinstance(e, OverrideParseException):
        return f"cannot parse the overrides: {_first_line(e)}"
    key = getattr(e.__cause__, "full_key", None)
    if isinstance(e, ConfigCompositionException) and key:
        # an override of a key no schema defines: the one key check's did-you-mean
        # (validate.unknown_keys), not Hydra's advice to add it with +; a key of another
        # framework than this one (framework.compile_mode on jax) keeps Hydra's line
        valid = valid_keys(declared())
        if key not in valid and not key.startswith(tuple(open_prefixes())):
            return str(unknown_key(key, valid))
    if isinstance(e, MissingConfigException) and e.options and e.missing_cfg_file:
        group, _, option = e.missing_cfg_file.rpartition("/")
        return (f"{group}={option}: no such option; {group} is one of "
                f"{', '.join(sorted(e.options))}")
    line = _first_line(e)
    cause = _first_line(e.__cause__) if e.__cause__ is not None else ""
    return f"{line}: {cause}" if cause and cause not in line else line


def _first_line(e: BaseException) -> str:
    return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
