"""What a framework declares about itself, readable without importing the framework.

Each framework package (``fxtrack/frameworks/<name>/__init__.py``) holds one ``FRAMEWORK =
Framework(...)``: its Backend class, its ``framework.compile=auto`` rule, the names its compile
modes are tagged with, its own config keys, the environment it needs before import, and the
optional capabilities it has. The orchestrator reads declarations to refuse impossible configs
before any work; a scenario asks the backend for a capability by name (``Backend.capability``)
and gets the framework's module for it, checked against the capability's protocol
(``fxtrack.frameworks.capabilities``), or ``NotSupported`` with the declared reason.

This module imports no framework and nothing above ``fxtrack.frameworks`` but the base module
``fxtrack.policy``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Mapping, MutableMapping, Optional, Union

from fxtrack.frameworks import capabilities
from fxtrack.policy import COMPILE_REQUESTS

# The optional capabilities a framework may declare: name -> what it is for, one line (each is a
# typing.Protocol in fxtrack.frameworks.capabilities, which the module a framework names for it
# satisfies: its functions take the built Backend first).
CAPABILITIES: dict[str, str] = {name: capabilities.meaning(protocol)
                                for name, protocol in capabilities.PROTOCOLS.items()}

# What model=custom supports, per lever or scenario the user's model cannot take generically:
# refused at validation (fxtrack.config.user_model) and by the worker (NotSupported).
CUSTOM_UNSUPPORTED: dict[str, str] = {
    "memory=checkpoint": "this framework has no rematerialisation policy for a user's model "
                         "(framework=torch and jax have one)",
    "parallel=fsdp": "this framework has no sharding policy for a user's model (framework=torch "
                     "and jax have one)",
    "scenario=checkpoint": "this framework has no checkpoint and serving export of a user's "
                           "model yet (framework=torch, tensorflow and jax have one; "
                           "framework=keras has no checkpoint path for any model)",
    "scenario=serve": "the serving batcher pads fxtrack's own synthetic batches to its "
                      "buckets, not your model's inputs",
}

# The CUSTOM_UNSUPPORTED entries a framework lifts by declaring a capability for a user's model.
CUSTOM_LIFTED_BY: dict[str, str] = {
    "scenario=checkpoint": "user_serving_export",
    "parallel=fsdp": "user_sharded_state",
    "memory=checkpoint": "user_remat",
}


# Run levers (a JobSpec field and value) that need a capability: refused before any work
# (fxtrack.scenarios.rules).
LEVERS: dict[tuple[str, str], str] = {
    ("parallel", "fsdp"): "sharded_state",
    ("memory", "checkpoint"): "remat",
}


class NotSupported(Exception):
    """A combination the framework declares it has no path for: a "not supported" cell, never
    a crash. Raised by ``Framework.capability`` (and by a capability's own module for a model it
    cannot handle, e.g. an exporter without a path for one architecture)."""


@dataclasses.dataclass(frozen=True)
class CompileRule:
    """One row of a framework's ``framework.compile=auto`` table: on ``device_kind`` (cpu | gpu
    | ``*``) for model ``family`` (a registered family's name, fxtrack.families, or ``*``),
    compile or not, why in one line, and ``docs``: the docs anchor (``docs/<page>.md#<anchor>``)
    holding the figure, its interval, the machine and the command behind a measured choice,
    or the best practice's source, so that re-measuring changes the docs only
    (``bench/compile_modes.py`` re-derives every row on the machine at hand)."""

    compiled: bool
    why: str  # one line, no figure (the figures live at ``docs``)
    docs: str = ""  # a declared framework's rules all have one (tests/test_compile_modes.py)
    device_kind: str = "*"
    family: str = "*"
    # size key -> [low, high): the row holds only there (where it was measured); a run whose
    # dims are unknown or outside falls through to the next row
    sizes: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    # the precisions the row holds at (empty: every one); a run whose precision is unknown or
    # another falls through to the next row
    precisions: tuple[str, ...] = ()

    def matches(self, device_kind: str, family: str,
                dims: Optional[Mapping[str, Any]] = None, precision: Optional[str] = None) -> bool:
        if not (self.device_kind in ("*", device_kind) and self.family in ("*", family)):
            return False
        if self.precisions and precision not in self.precisions:
            return False
        return all(dims is not None and isinstance(dims.get(key), (int, float))
                   and low <= dims[key] < high for key, (low, high) in self.sizes.items())


@dataclasses.dataclass(frozen=True)
class Limit:
    """A combination this framework has no path for although it has the capability (e.g. its
    int8 kernels are CPU-only): ``when(combination)`` (a ``fxtrack.scenarios.rules.Combination``,
    whose ``device_kind`` may be None: not known yet) -> refused as ``"<what> is not supported
    by <name>: <why>"`` before any work; the framework's own code still raises NotSupported.
    ``what`` may be a function of the combination (``runtime=<its runtime>``)."""

    what: Union[str, Callable[[Any], str]]
    when: Callable[[Any], bool]
    why: str

    def describe(self, combination: Any) -> str:
        return self.what(combination) if callable(self.what) else self.what


@dataclasses.dataclass(frozen=True)
class Setting:
    """A config key only this framework has: ``framework.<name>``, one of ``choices``. An
    ``identity`` setting tells runs apart as the framework does (Keras's backend): the run
    carries it as the ``fxtrack.<name>`` tag, the report gives each value its own column
    (``keras-jax``), ``compare`` pairs on it and the run name shows it."""

    default: str
    choices: tuple[str, ...]
    help: str
    identity: bool = False


@dataclasses.dataclass(frozen=True)
class HeldTwice:
    """When this framework's peak memory holds the training state twice (JAX without donation):
    its run tag ``fxtrack.<tag>`` starts with ``prefix``; the report marks the memory cell 2x
    and adds ``note``."""

    tag: str
    prefix: str
    note: str


@dataclasses.dataclass(frozen=True)
class Framework:
    name: str
    backend: str  # "module:Class" of its fxtrack.frameworks.base.Backend
    extra: str  # the pip extra that installs it, for error messages
    report_order: int  # where its column stands in the report (lower: further left)
    compile_rules: tuple[CompileRule, ...]  # framework.compile=auto: the first match wins
    # fxtrack.compile_mode when compiled; "{<setting>}" (the run's framework settings, e.g.
    # torch's "{compile_mode}") are filled in; or a function of the settings
    # where the name differs per setting value (Keras: jit on JAX, xla on TensorFlow)
    compiled_tag: Union[str, Callable[[Mapping[str, Any]], str]]
    uncompiled_tag: Union[str, Callable[[Mapping[str, Any]], str]]  # ... when not ("eager")
    uncompiled_builds_graph: bool = False  # a plain tf.function still traces: compile_time_s
    # framework.compile=tune: the modes (compiled?) the worker times, in this order; one mode
    # (JAX: jit, its op-by-op dispatch is a debugging mode) is taken without timing
    tune_modes: tuple[bool, ...] = (True, False)
    # model=custom: the model.<key> holding this framework's builder ("package.module:function");
    # None: the framework's own name (TensorFlow reads model.keras, as Keras on any backend will)
    model_key: Optional[str] = None
    # capability name (a key of CAPABILITIES) -> "module" implementing it
    capabilities: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # capability name -> why it is absent (the "not supported" message says this)
    absent: Mapping[str, str] = dataclasses.field(default_factory=dict)
    settings: Mapping[str, Setting] = dataclasses.field(default_factory=dict)
    limits: tuple[Limit, ...] = ()  # checked with the framework-neutral rules, before any work
    held_twice: Optional[HeldTwice] = None  # the report's memory table reads it
    # prepare_environment(spec, env): sets in ``env`` (os.environ) what the framework reads when
    # it is imported (platform, XLA flags, allocator), before the worker imports it
    prepare_environment: Optional[Callable[[Any, MutableMapping[str, str]], None]] = None
    words: str = ""  # how a sentence names it (PyTorch): the usage, the answer page; "": name
    colour: str = "grey"  # the colour every chart draws it in, the same on each

    @property
    def said(self) -> str:
        """The framework as a sentence names it."""
        return self.words or self.name

    def __post_init__(self) -> None:
        unknown = set(self.capabilities) - set(CAPABILITIES)
        if unknown:
            raise ValueError(f"{self.name} declares unknown capabilities {sorted(unknown)}")

    def setting(self, spec: Any, name: str) -> str:
        """``framework.<name>`` for this run: the JobSpec's value, or the declared default (a
        spec written without the orchestrator, e.g. by a bench script)."""
        return spec.framework_settings.get(name, self.settings[name].default)

    @property
    def builder_key(self) -> str:
        """The ``model.<key>`` with this framework's builder for ``model=custom``."""
        return self.model_key or self.name

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    def unsupported(self, capability: str, what: Optional[str] = None,
                    version: Optional[str] = None) -> NotSupported:
        """The error for an absent ``capability``: ``"<what> is not supported by <name>
        [<version>]: <the declared reason>"`` (the report's not-supported cell quotes it up to
        the reason)."""
        why = self.absent.get(capability, "not implemented for this framework")
        by = f"{self.name} {version}" if version else self.name
        return NotSupported(f"{what or capability} is not supported by {by}: {why}")

    def capability(self, name: str) -> Any:
        """The module implementing ``name``, imported now and checked against the capability's
        protocol (``fxtrack.frameworks.capabilities``); NotSupported when it is absent."""
        if name not in CAPABILITIES:
            raise KeyError(f"unknown capability {name!r} (one of {', '.join(CAPABILITIES)})")
        if name not in self.capabilities:
            raise self.unsupported(name)
        module = importlib.import_module(self.capabilities[name])
        problems = capabilities.mismatches(capabilities.PROTOCOLS[name],
                                           capabilities.module_functions(module))
        if problems:  # a broken declaration: said before the scenario calls into it
            raise TypeError(f"{module.__name__} does not provide capability {name!r} of "
                            f"{self.name}: {'; '.join(problems)}")
        return module

    def resolve_compile(self, device_kind: str, family: str, request: str = "auto",
                        timings: Optional[Mapping[bool, float]] = None,
                        settings: Optional[Mapping[str, Any]] = None,
                        dims: Optional[Mapping[str, Any]] = None,
                        precision: Optional[str] = None) -> tuple[bool, str]:
        """(compile?, why) for ``framework.compile=request``: ``true`` / ``false`` as asked,
        ``auto`` the first matching row of ``compile_rules``, ``tune`` the fastest of
        ``timings`` ({compiled?: median step seconds} for each of ``tune_modes``, timed on the
        run's model by fxtrack.scenarios.tune; a framework with one mode needs none). ``dims``
        and ``precision``: the model's sizes and the run's precision, for the rows that hold
        at some sizes or precisions only."""
        if request not in COMPILE_REQUESTS:
            raise ValueError(f"framework.compile must be one of {', '.join(COMPILE_REQUESTS)}, "
                             f"got {request!r}")
        if request == "tune":
            return self._fastest(timings or {}, settings)
        if request != "auto":
            return request == "true", f"framework.compile={request}"
        for rule in self.compile_rules:
            if rule.matches(device_kind, family, dims, precision):
                return rule.compiled, f"auto: {rule.why}" + (f" ({rule.docs})" if rule.docs else "")
        raise ValueError(f"{self.name} declares no compile rule for {family} on {device_kind}")

    def _fastest(self, timings: Mapping[bool, float],
                 settings: Optional[Mapping[str, Any]]) -> tuple[bool, str]:
        names = [self.compile_mode_tag(c, settings) for c in self.tune_modes]
        if len(self.tune_modes) == 1:
            return self.tune_modes[0], f"tuned: {names[0]}, the only mode {self.name} declares"
        missing = [n for c, n in zip(self.tune_modes, names) if c not in timings]
        if missing:
            raise ValueError(f"framework.compile=tune has no step time for {', '.join(missing)}")
        # ties go to the first declared mode
        best = min(self.tune_modes, key=lambda c: timings[c])
        return best, f"tuned: fastest of {', '.join(names)}"

    def tuned_figures(self, timings: Mapping[bool, float],
                      settings: Optional[Mapping[str, Any]] = None) -> str:
        """The ``fxtrack.compile_tuned`` tag: each mode's median step time as timed for
        ``tune``, e.g. ``xla=812.3ms;tf.function=1104.9ms`` (one declared mode: not timed)."""
        if len(self.tune_modes) == 1:
            only = self.compile_mode_tag(self.tune_modes[0], settings)
            return f"{only}=not timed (the only mode {self.name} declares)"
        return ";".join(f"{self.compile_mode_tag(c, settings)}={timings[c] * 1e3:.1f}ms"
                        for c in self.tune_modes)

    def compile_mode_tag(self, compiled: bool,
                         settings: Optional[Mapping[str, Any]] = None) -> str:
        """The ``fxtrack.compile_mode`` tag: what actually ran; ``settings`` the run's
        framework settings (``JobSpec.framework_settings``; missing ones at their defaults)."""
        tag = self.compiled_tag if compiled else self.uncompiled_tag
        values = {key: s.default for key, s in self.settings.items()}
        values.update(settings or {})
        if callable(tag):
            tag = tag(values)
        return tag.format(**values)

    def builds_graph(self, compiled: bool) -> bool:
        """Whether the first step builds a graph (then compile_time_s is logged)."""
        return compiled or self.uncompiled_builds_graph


def append_xla_flag(env: MutableMapping[str, str], flag: str) -> None:
    """Append one flag to XLA_FLAGS (read by XLA when JAX or TF starts its backend)."""
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flag}".strip()


def import_path(path: str) -> Any:
    """``"package.module:name"`` -> the object."""
    module, _, name = path.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, name) if name else obj


def declaration(package: str) -> Framework:
    """The ``FRAMEWORK`` that ``package`` (e.g. ``fxtrack.frameworks.torch``) declares."""
    framework = getattr(importlib.import_module(package), "FRAMEWORK", None)
    if not isinstance(framework, Framework):
        raise ValueError(f"{package} declares no FRAMEWORK = fxtrack.frameworks.declaration."
                         "Framework(...)")
    return framework
