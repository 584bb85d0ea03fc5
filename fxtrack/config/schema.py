"""Dataclass schemas for ``conf/``: types come from here, values from the YAML files.

Every group option's YAML file names its schema in its defaults list (``/schema/<group>/<name>``),
so a typo, a wrong type or an unknown key fails while Hydra composes the config, before any
work starts. Value checks (``batch_size=0``) run in ``__post_init__`` when the orchestrator turns
the composed config into objects with ``OmegaConf.to_object``.

Model sizes default to their family's declaration (``fxtrack.families``, read through
``fxtrack.architectures``) by the ``fx.arch`` resolver, at the chosen ``size``; an explicit
override (``model.layers=2``) wins. The ``model`` group's options are those declarations,
registered in Hydra's ConfigStore as the scenarios are, not YAML files.
"""

from __future__ import annotations

import dataclasses
import functools
import enum
import os
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, II, OmegaConf

from fxtrack import architectures, families
from fxtrack.config import slurm
from fxtrack.frameworks.declaration import import_path
from fxtrack.policy import COMPILE_REQUESTS, allowed_cpus
from fxtrack.scenarios import SCENARIOS
from fxtrack.scenarios.options import apart, at_least, finite_fields, positive


def _arch(key: str) -> Any:
    return dataclasses.field(default=II(f"fx.arch:{key}"))


def _arch_resolver(key: str, *, _root_: Any) -> Any:
    value = architectures.size_default(_root_.model.name, _root_.size.name, key)
    return list(value) if isinstance(value, tuple) else value


SEED_MAX = 2**32 - 1  # the largest seed every framework's generator takes


@dataclasses.dataclass
class FrameworkConfig:
    name: str = MISSING
    # The framework's package (fxtrack.frameworks.<name>): its declaration names the worker-side
    # Backend, the pip extra, the compile rules and the capabilities.
    package: str = MISSING
    # auto: the framework's best mode for this device and model family (its declaration's
    # table); true / false force torch.compile / XLA (tf jit_compile) / jax.jit on or off;
    # tune: the worker times each mode the framework declares on this model, keeps the fastest.
    compile: str = "auto"
    # interpreter for this framework's worker; None: the current one
    python: Optional[str] = apart("a path: the framework's version is a provenance tag, which "
                                  "the trend compares", default=None)
    # "torchrun": devices > 1 (or nodes > 1) start one worker per device through
    # torch.distributed.run; "process": one worker drives every device (tf.distribute, JAX SPMD).
    launcher: str = apart("how the workers start: the devices and the parallel lever they "
                          "run are identity", default="process")

    def __post_init__(self) -> None:
        self.compile = str(self.compile).lower()  # `framework.compile=true` arrives as a bool
        if self.compile not in COMPILE_REQUESTS:
            raise ValueError(f"framework.compile must be one of {', '.join(COMPILE_REQUESTS)}, "
                             f"got {self.compile!r}")



# framework name -> its schema (FrameworkConfig plus the keys its declaration adds), made once so
# that register() stays idempotent.
_FRAMEWORK_SCHEMAS: dict[str, type] = {}


def framework_schema(name: str) -> type:
    """The schema of ``framework=<name>``: FrameworkConfig with one ``str`` field per declared
    ``Setting`` (``framework.<key>``), value-checked against its choices. A framework whose
    YAML names no package (or an unknown name) gets FrameworkConfig itself."""
    if name not in _FRAMEWORK_SCHEMAS:
        from fxtrack.config.frameworks import declared

        framework = declared().get(name)
        if framework is None:
            return FrameworkConfig
        _FRAMEWORK_SCHEMAS[name] = _with_settings(name, framework.settings)
    return _FRAMEWORK_SCHEMAS[name]


def _with_settings(name: str, settings: Any) -> type:
    def __post_init__(self) -> None:
        FrameworkConfig.__post_init__(self)
        for key, setting in settings.items():
            value = str(getattr(self, key))
            if value not in setting.choices and value.lower() in setting.choices:
                value = value.lower()  # `framework.<key>=true` arrives as a bool
            if value not in setting.choices:
                raise ValueError(f"framework.{key} must be one of {', '.join(setting.choices)}, "
                                 f"got {value!r}")
            setattr(self, key, value)

    fields = [(key, str, dataclasses.field(default=setting.default))
              for key, setting in settings.items()]
    return dataclasses.make_dataclass(f"{name.title().replace('_', '')}FrameworkConfig", fields,
                                      bases=(FrameworkConfig,),
                                      namespace={"__post_init__": __post_init__})


def sized_schema(family: families.Family) -> type:
    """The schema of a family's ``model=<name>``: the model's name and one positive ``int`` field
    per size key (``Family.size_keys``), defaulting to the model's declared dims at the chosen
    ``size`` (e.g. ``VitConfig``: image_size, num_classes, patch, layers, hidden, heads,
    mlp_dim)."""
    def __post_init__(self: Any) -> None:
        positive("model.", **{key: getattr(self, key) for key in family.size_keys})

    fields = [(key, int, _arch(key)) for key in family.size_keys]
    # model.from_run=<run id>: scenario=inference evaluates that converge run's trained weights
    # (its dims and data replace these: fxtrack.orchestrator.from_run)
    fields.append(("from_run", Optional[str], dataclasses.field(default=None)))
    return dataclasses.make_dataclass(
        f"{family.name.title()}Config", [("name", str, dataclasses.field(default=MISSING)), *fields],
        namespace={"__post_init__": __post_init__})


@dataclasses.dataclass
class CustomConfig:
    """model=custom: a user's own model (docs/your-own-model.md). One builder per framework
    family, ``"package.module:function"``, called as ``FUNC(batch_size=B, seed=S, **kwargs)``;
    ``keras`` serves framework=tensorflow (and keras)."""

    name: str = MISSING
    torch: Optional[str] = None
    keras: Optional[str] = None
    jax: Optional[str] = None
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    optimizer: str = "adamw"  # adamw | sgd, built as for fxtrack's own models
    lr: float = 1e-3
    kind: str = "plain"  # plain | lm: a language model, measured in tokens as model=llama is
    seq_axis: int = 1  # model.kind=lm: the inputs' sequence axis (0 is the batch)
    # class names of the model's submodules: parallel=fsdp's sharding units, memory=checkpoint's
    # recomputed blocks; empty: the items of its first repeated container (docs/your-own-model.md)
    shard_modules: list[str] = dataclasses.field(default_factory=list)
    remat_modules: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        from fxtrack.frameworks.user_builder import KINDS, OPTIMIZERS

        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"model.optimizer must be one of {', '.join(OPTIMIZERS)}, "
                             f"got {self.optimizer!r}")
        if self.kind not in KINDS:
            raise ValueError(f"model.kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.seq_axis < 1:
            raise ValueError(f"model.seq_axis must be 1 or more (axis 0 is the batch), got "
                             f"{self.seq_axis}")
        for key in ("shard_modules", "remat_modules"):
            bad = [n for n in getattr(self, key) if not str(n).isidentifier()]
            if bad:
                raise ValueError(f"model.{key} takes class names, got {bad[0]!r}")
        finite_fields("model.", self)
        positive("model.", lr=self.lr)


@dataclasses.dataclass
class PrecisionConfig:
    name: str = MISSING  # fp32 (strict IEEE) | tf32 | bf16 | fp16


@dataclasses.dataclass
class HardwareConfig:
    name: str = MISSING  # auto | cpu | gpu
    # Multi-node: each defaults, when not given, to SLURM's view of the job (SLURM_NNODES,
    # SLURM_NODEID, first host of SLURM_JOB_NODELIST:29500; fxtrack/config/slurm.py),
    # read on the node that runs the job; outside SLURM: 1, 0, None (coordinator: host:port).
    nodes: int = dataclasses.field(default=II("fx.slurm:nodes"))
    node_rank: int = apart("which node logged: the nodes of one run are one experiment",
                           default=II("fx.slurm:node_rank"))
    coordinator: Optional[str] = apart("an address", default=II("fx.slurm:coordinator"))
    # Threads every framework's worker uses (intra-op pools, OMP/MKL); None: the cores this
    # process may run on (os.sched_getaffinity).
    cpu_threads: Optional[int] = None
    # wait up to this long for the machine to go quiet before timing
    wait_for_idle_s: float = apart("how long to wait for quiet: a contended run is a caveat "
                                   "(fxtrack.contended), not another experiment", default=0.0)
    # Other processes on the run's GPUs (docs/running-on-a-gpu.md): warn (tag the run
    # contended), error (fail before any work) or wait (up to wait_for_idle_s for them to go).
    gpu_isolation: str = apart("what to do about other processes: their presence is a caveat "
                               "(fxtrack.contended)", default="warn")
    # Price of one device-hour of this hardware, any currency; None: no cost_per_1m_* metrics.
    price_per_hour: Optional[float] = apart("prices the figures (cost_per_1m_*), never changes "
                                            "them", default=None)

    def __post_init__(self) -> None:
        finite_fields("hardware.", self)
        positive("hardware.", nodes=self.nodes, cpu_threads=self.cpu_threads,
                  price_per_hour=self.price_per_hour)
        # more threads than the machine has CPUs only oversubscribes them, and in the tens of
        # thousands a framework's pool creation crashes the worker (SIGSEGV)
        cpus = os.cpu_count() or 1
        if self.cpu_threads is not None and self.cpu_threads > cpus:
            raise ValueError(f"hardware.cpu_threads={self.cpu_threads} is more than the {cpus} "
                             f"CPUs of this machine; set at most {cpus}, or null for the "
                             f"{len(allowed_cpus())} cores this process may run on")
        if self.gpu_isolation not in ("warn", "error", "wait"):
            raise ValueError("hardware.gpu_isolation must be warn, error or wait, got "
                             f"{self.gpu_isolation!r}")
        at_least("hardware.", 0, wait_for_idle_s=self.wait_for_idle_s)
        if not 0 <= self.node_rank < self.nodes:
            raise ValueError(f"hardware.node_rank must be in [0, {self.nodes}), got {self.node_rank}")
        if self.nodes > 1 and not self.coordinator:
            raise ValueError("hardware.coordinator (host:port of node 0) is required when "
                             "hardware.nodes > 1")


@dataclasses.dataclass
class SizeConfig:
    name: str = MISSING  # full | tiny


@dataclasses.dataclass
class DataConfig:
    """data=<name>: what a run trains and evaluates on (``fxtrack.data``); the model family takes
    its input shape, classes or vocabulary from it. ``synthetic``: the generated batches."""

    name: str = MISSING  # synthetic | mnist | mnist1d | pycode | file
    # data=file: a .npz (x, y), .parquet or .csv
    path: Optional[str] = apart("a path: the file's content digest (fxtrack.data_digest) is the "
                                "identity, so a moved file is the same data, an edited one not",
                                default=None)
    label: str = "label"  # data=file, a table: the label column (the others are features)
    holdout: float = 0.2  # the held-out share (mnist, pycode, file; mnist1d keeps its own)

    def __post_init__(self) -> None:
        finite_fields("data.", self)
        if self.path:  # the worker, or a launcher's job elsewhere, reads the same file
            self.path = os.path.abspath(os.path.expanduser(self.path))
        if not 0 < self.holdout < 1:
            raise ValueError(f"data.holdout must be between 0 and 1, got {self.holdout}")


@dataclasses.dataclass
class TrackingConfig:
    experiment: str = apart("where the record goes", default="fxtrack")
    # None: $MLFLOW_TRACKING_URI, else sqlite:///<launch directory>/mlflow.db
    uri: Optional[str] = apart("where the record goes", default=None)


class Parallel(enum.Enum):
    ddp = "ddp"  # replicated parameters, all-reduced gradients
    fsdp = "fsdp"  # parameters, gradients and optimiser state sharded over the devices


class Memory(enum.Enum):
    none = "none"
    checkpoint = "checkpoint"  # activation rematerialisation per block


class Runtime(enum.Enum):  # scenario=inference: what serves the exported model
    native = "native"
    onnxruntime = "onnxruntime"
    tflite = "tflite"
    openvino = "openvino"
    tensorrt = "tensorrt"


class Quantize(enum.Enum):
    none = "none"
    dynamic_int8 = "dynamic_int8"


@dataclasses.dataclass
class FxtrackConfig:
    framework: FrameworkConfig = MISSING
    model: Any = MISSING
    precision: PrecisionConfig = MISSING
    # the chosen scenario's own options (fxtrack.scenarios.options), registered per scenario
    scenario: Any = MISSING
    hardware: HardwareConfig = MISSING
    size: SizeConfig = MISSING
    data: DataConfig = MISSING
    batch_size: Optional[int] = None  # per device; None: the hardware's default for the model
    devices: int = 1  # data-parallel device count
    # timed steps; None: the hardware's default
    steps: Optional[int] = apart("the window's length: more steps narrow a figure's interval, "
                                 "not what it measures", default=None)
    # untimed steps; the first step's time is first_step_time_s
    warmup_steps: Optional[int] = apart("untimed steps before the window", default=None)
    seed: int = apart("a repeat group's runs differ by it; a run of another seed measures the "
                      "same experiment", default=0)
    # each config run N times as N workers (round-robin across a sweep)
    repeats: int = apart("how many runs a group holds: its n, said beside its figure",
                         default=1)
    parallel: Parallel = Parallel.ddp
    memory: Memory = Memory.none
    runtime: Runtime = Runtime.native
    quantize: Quantize = Quantize.none
    # a worker running longer is stopped and its run marked FAILED
    timeout_s: float = apart("a limit, not a setting of the run", default=7200.0)
    verbose: bool = apart("what the terminal shows", default=False)  # frameworks' own log spam
    # skip a run (a sweep's cell) whose identical config already has a FINISHED run in the
    # store (tag fxtrack.config_id); without it a re-run is new runs
    resume: bool = apart("whether finished cells are skipped", default=False)
    tracking: TrackingConfig = dataclasses.field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        finite_fields("", self)
        positive("", batch_size=self.batch_size, devices=self.devices, steps=self.steps,
                  timeout_s=self.timeout_s, repeats=self.repeats)
        # warmup_steps=0 is allowed: the first timed step then carries the compilation, and
        # first_step_time_s says so (the timer's side, fxtrack/measure/timer.py).
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        # every framework's generator takes a seed in [0, 2**32 - 1] (NumPy refuses a negative
        # one; a larger one overflowed in the worker, after the run had started)
        if not 0 <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be an integer from 0 to {SEED_MAX} (2**32 - 1), got "
                             f"{self.seed}")


_GROUP_SCHEMAS = {
    "framework": FrameworkConfig,
    "precision": PrecisionConfig,
    "hardware": HardwareConfig,
    "size": SizeConfig,
    "data": DataConfig,
}
# family -> its schema, made once per family so that register() stays idempotent
_MODEL_SCHEMAS: dict[str, type] = {}


def model_schemas() -> dict[str, type]:
    """Each registered family's schema (``/schema/model/<family>``): a user's model takes its
    declaration (CustomConfig), another family its size keys (``sized_schema``)."""
    for name in families.names():
        if name not in _MODEL_SCHEMAS:
            family = families.get(name)
            _MODEL_SCHEMAS[name] = (sized_schema(family) if family.user is None
                                    else import_path(family.user.config_schema))
    return dict(_MODEL_SCHEMAS)


def _open_kwargs(schema: type) -> Any:
    """``schema`` as a node whose ``kwargs`` (model=custom: the builder's keyword arguments)
    takes any key on the command line, ``model.kwargs.width=256`` without Hydra's ``+``."""
    if not any(f.name == "kwargs" for f in dataclasses.fields(schema)):
        return schema
    node = OmegaConf.structured(schema)
    OmegaConf.set_struct(node.kwargs, False)
    return node


def _open_options(options: type) -> Any:
    """A scenario's options as a node that takes another scenario's key while composing, so
    that a sweep across scenarios may set an option of one of them
    (``scenario=inference,pipeline scenario.dataset_samples=32``); validation then refuses it,
    or drops it in a sweep's job whose scenario has no such option
    (``fxtrack.config.validate.scenario_keys_of``). Typed keys stay typed."""
    node = OmegaConf.structured(options)
    OmegaConf.set_struct(node, False)
    return node


def register() -> None:
    """Register the schemas in Hydra's ConfigStore and the ``fx.*`` resolvers (idempotent)."""
    if not OmegaConf.has_resolver("fx.arch"):
        OmegaConf.register_new_resolver("fx.arch", _arch_resolver)
    if not OmegaConf.has_resolver("fx.slurm"):
        OmegaConf.register_new_resolver("fx.slurm", slurm.setting)
    cs = ConfigStore.instance()
    cs.store(name="fxtrack_schema", node=FxtrackConfig)
    for name, scenario in SCENARIOS.items():  # scenario=<name>: its options and their defaults
        cs.store(group="scenario", name=name, node=_open_options(scenario.options))
    for group, schema in _GROUP_SCHEMAS.items():
        cs.store(group=f"schema/{group}", name="base", node=schema)
    for fam, schema in model_schemas().items():
        cs.store(group="schema/model", name=fam, node=_open_kwargs(schema))
    # model=<name>: each family's declared models (fxtrack.families), on their family's schema;
    # a user's own model YAML ($FXTRACK_CONFIG_DIR/model/) names one the same way
    for name, (fam, _) in families.models().items():
        cs.store(group="model", name=name,
                 node={"defaults": [f"/schema/model/{fam.name}@_here_", "_self_"], "name": name})
    from fxtrack.config.frameworks import declared

    for name in declared():  # framework/<name>.yaml names /schema/framework/<name>@_here_
        cs.store(group="schema/framework", name=name, node=framework_schema(name))


def apart_from_identity() -> dict[str, str]:
    """Every config key declared apart from a run's identity (``options.apart``) -> why: the
    fields of the top-level schema and of each group's, and every scenario's options."""
    from fxtrack.scenarios.options import apart_from_identity as options_apart

    # a scenario registered later (a test's toy) brings its options: they are read each time
    return {**_schemas_apart(), **options_apart()}


@functools.cache
def _schemas_apart() -> dict[str, str]:
    """The schemas' part of ``apart_from_identity``: fixed at import, and a report asks it per
    column of every block (type hints cost a compile each)."""
    import typing

    from fxtrack.scenarios.options import apart_keys

    found = dict(apart_keys(FxtrackConfig))
    for name, kind in typing.get_type_hints(FxtrackConfig).items():
        if dataclasses.is_dataclass(kind):
            found.update(apart_keys(kind, f"{name}."))
    found.update(apart_keys(FrameworkConfig, "framework."))  # its schema is made per framework
    return found
