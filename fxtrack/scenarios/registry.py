"""The scenario registry: one typed spec per scenario (``Scenario``), registered once and looked
up by name, as the model families are (``fxtrack.families``) and as optimum-benchmark keeps a
folder per scenario. Shared code asks the spec what a scenario is and does (its options, its
worker runner, whether it trains, how it is orchestrated, its report section), never the
scenario's name: a new scenario is one folder (``fxtrack/scenarios/<name>/``, docs/extending.md).

A scenario's folder is a package: its ``__init__`` holds its options and its ``register`` call;
its parts are modules of fixed names beside it (``PARTS``), each in the layer of its caller (the
worker's runner, the orchestrator's driver, the config layer's check, the report's section).
``Scenario.part`` imports one when it is asked for, so this module and every scenario's
``__init__`` import nothing above the worker, and no part is imported by anything else
(pyproject.toml's import contracts).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Optional

from fxtrack import metrics
from fxtrack.scenarios import options as opts


# what measures an objective (``Objective.command``): {frameworks} and {model} are filled in by
# the answer page, %s is the scenario
MEASURE = "python -m fxtrack -m framework={frameworks} model={model} scenario=%s repeats=3"


def _no_refusal(options: Any, family: Any, batch_size: Optional[int]) -> Optional[str]:
    return None


@dataclasses.dataclass(frozen=True)
class Rule:
    """A combination no framework has a path for: ``when`` it holds, the run is refused with
    ``"<what> is not supported by <framework>: <why and the fix>"``. ``what`` and ``when`` read
    a ``fxtrack.scenarios.rules.Combination``. A scenario's own are in its spec
    (``Scenario.rules``), the framework-neutral ones in ``rules.RULES``."""

    what: Callable[[Any], str]
    when: Callable[[Any], bool]
    why: str


def is_deploy(c: Any) -> bool:
    """The combination asks for a deployment runtime or quantisation."""
    return c.runtime != "native" or c.quantize != "none"


def deploy_levers(c: Any) -> str:
    """The deployment overrides a combination sets, as typed: ``runtime=... quantize=...``."""
    levers = [f"runtime={c.runtime}"] if c.runtime != "native" else []
    return " ".join(levers + ([f"quantize={c.quantize}"] if c.quantize != "none" else []))


def one_device(scenario: str, why: str) -> Rule:
    """The rule of a scenario measured on one device."""
    return Rule(lambda c: f"scenario={scenario} with devices={c.devices * c.nodes}",
                lambda c: c.devices * c.nodes > 1, why)


@dataclasses.dataclass(frozen=True)
class Objective:
    """One block of the answer page (``fxtrack.report.answer``): which framework wins it, read
    from the runs of the scenario that declares it. Plain data, so the registry imports nothing
    above it."""

    key: str
    title: str
    metrics: tuple[str, ...]  # the first of these a run logged is the figure
    batch: str  # "common": the batch size most frameworks ran; "one": batch 1; "largest"
    phrase: tuple[str, str]  # sentence: "<fw> <verb> <model> <r>x <adjective> <other>"
    # what measures it: {frameworks} (those declaring the scenario's needs) and {model} are
    # filled in by the answer page
    command: str
    rank: int  # where its block stands on the answer page (lower: higher up)
    lm_only: bool = False
    # the best's figure as a fraction of the other's, "in 0.88x [..] the peak memory of": a
    # lower-is-better amount reads wrongly as "1.14x less"
    fraction: bool = False
    # the declaring scenario's section's function (the repeats' figures, None where a run has
    # none) -> (the kept, why not): a rule for which repeats a figure stands on (converge:
    # MLPerf's, the fastest and the slowest of at least 5 dropped); None: every repeat
    repeats_rule: Optional[str] = None
    # identity columns a framework chooses, compared within one block as its compile mode is
    # (serve: ``scenario.batching``); every other option makes another block
    modes: tuple[str, ...] = ()
    scenario: str = ""  # the declaring scenario's name (objectives() fills it in)

    @property
    def lower(self) -> bool:
        """Lower is better: the metric registry's direction of the objective's figure."""
        return metrics.lookup(self.metrics[0]).lower_is_better


# A scenario's parts: module -> the function every such module defines, and who calls it.
PARTS = {
    "runner": "run",  # worker: (backend, result) -> None; fills the Result
    # orchestrator: (job, job_dir, parent) -> (name, result, run id): a probe search or a device
    # sweep run in place of one job (repeats=N then repeats in its own way)
    "driver": "run",
    "check": "check",  # config layer: (conf, arch) -> why it cannot run, one line, or None
    "section": "section",  # report: (runs, frame) -> Optional[fxtrack.report.tables.Section]
}
# Functions a part may define besides its own, each asked for by name where it is used:
#   section.charts(frame, runs, out, histories) -> [Chart]: the report's charts of it
#   section.closing_table(jobs, aggregates) -> str: its table at the end of a sweep ("" none)
#   section.<Objective.repeats_rule>, section.sample_efficiency: rules its repeats stand on
#   check.cross_check(result, spec, held): the orchestrator's check of each finished run against
#   earlier ones of the sweep (converge's trajectory against the first framework's)


@dataclasses.dataclass(frozen=True)
class Scenario:
    """What shared code may ask about a scenario."""

    name: str
    summary: str  # one line: what it measures (the CLI usage, the contract's Groups table)
    options: type  # its typed options (an Options dataclass), ConfigStore scenario/<name>
    package: str  # its folder's package (its __init__'s __name__): where its parts are
    parts: tuple[str, ...] = ("runner",)  # the PARTS its folder has; no runner: not implemented
    # (options, family, batch_size) -> why it cannot run, one line, before any work; or None
    refusal: Callable[[Any, Any, Optional[int]], Optional[str]] = _no_refusal
    # the capabilities a framework must declare to run it with any model (else the framework's
    # declared reason refuses it before any work)
    needs: tuple[str, ...] = ()
    # the metrics only this scenario logs (fxtrack.metrics.Metric; the shared ones are there)
    own_metrics: tuple[Any, ...] = ()
    # combinations of this scenario without a path, checked (in order) before the neutral rules
    rules: tuple[Rule, ...] = ()
    # (capability, what the refusal names) a combination needs beyond ``needs``, from its
    # family (serve: a decoder LM's generate, another model's inference); None: nothing more
    capability: Optional[Callable[[Any], Optional[tuple[str, str]]]] = None
    # (option, capability): a run that sets the option (to anything but 0, False or None) needs
    # the capability (else refused before any work, as ``needs``): train's profile_steps
    option_needs: tuple[tuple[str, str], ...] = ()
    # the capability a run on more than one device needs (else refused before any work):
    # converge's batch split and sharded start; None: the framework's own devices > 1 rules
    devices_need: Optional[str] = None
    memory_floor: bool = True  # refused when the architecture cannot fit the device (fit: no)
    # its runs time compute (achieved_tflops), so MFU against the peak: the orchestrator makes
    # sure of the peak before the job (calibration.preflight); False: no timed compute
    mfu: bool = True
    trains: bool = True  # the memory check and the dataset context: a training step, or a forward
    decodes: bool = False  # a language model holds a KV cache, not a batch's logits
    reads_files: bool = False  # its data comes from files on disk (the logged dataset's source)
    deploys: bool = False  # runtime= and quantize= apply (the report's deployment table)
    real_data: bool = False  # trains on data=<name> (fxtrack.data), never on synthetic batches
    # model.from_run: it serves a converge run's trained weights and scores them on that run's
    # held-out split (fxtrack.scenarios.accuracy)
    from_run: bool = False
    sweeps_devices: bool = False  # runs at 1, 2, ..., devices (the memory check takes each)
    # the tag (fxtrack.<probe_tag> = its parent's result id) on each of its child runs (a
    # search's probes: fit's fit_of, serve's serve_probe_of): counted through their parent
    probe_tag: Optional[str] = None
    # the run's tags its streamed child windows (Result.children) copy, besides those every
    # child copies (orchestrator/job.py): serve's batching policy and buckets
    child_tags: tuple[str, ...] = ()
    # Result.artifacts roles logged as <role>.json beside the run (serve's per-request rows)
    artifacts: tuple[str, ...] = ()
    # options that make another configuration and so go into the run's name where they differ
    # from their default (serve's batching policy): runs of two policies never share a name
    named_options: tuple[str, ...] = ()
    objectives: tuple[Objective, ...] = ()  # its blocks of the answer page

    def part(self, name: str, function: Optional[str] = None) -> Optional[Callable[..., Any]]:
        """Part ``name``'s function (``PARTS[name]``, or ``function`` of that module), its
        module imported now; None where the scenario has no such part, or the part no such
        ``function`` (an optional one: its charts). A declared part without its own function
        is an error, not a part that silently does nothing."""
        if name not in PARTS:
            raise KeyError(f"{name!r} is not a scenario part (parts: {', '.join(PARTS)})")
        if name not in self.parts:
            return None
        module = importlib.import_module(f"{self.package}.{name}")
        if function is not None:
            return getattr(module, function, None)
        if not callable(getattr(module, PARTS[name], None)):
            raise AttributeError(f"scenario {self.name!r}: {module.__name__} has no "
                                 f"{PARTS[name]}(), its {name} part's function")
        return getattr(module, PARTS[name])

    @property
    def runner_path(self) -> str:
        """The runner as the JobSpec carries it across the process boundary ("module:function"):
        the worker imports it without the registry, so a scenario of a user's package runs."""
        return f"{self.package}.runner:{PARTS['runner']}"

    @property
    def repeatable(self) -> bool:
        """repeats=N aggregates N runs of one job; a driver repeats in its own way."""
        return "driver" not in self.parts

    @property
    def implemented(self) -> bool:
        return "runner" in self.parts

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metric keys it logs (the registry ``fxtrack.metrics``, the contract's notation)."""
        return tuple(m.name for m in metrics.registered() if self.name in m.scenarios)


SCENARIOS: dict[str, Scenario] = {}


def register(scenario: Scenario) -> Scenario:
    """Add ``scenario`` (the same spec again is a no-op; another under a taken name is an error)."""
    held = SCENARIOS.get(scenario.name)
    if held is not None and held != scenario:
        raise ValueError(f"scenario {scenario.name!r} is registered already")
    unknown = set(scenario.parts) - set(PARTS)
    if unknown:
        raise ValueError(f"scenario {scenario.name!r}: {', '.join(sorted(unknown))} is not a part "
                         f"(parts: {', '.join(PARTS)})")
    if not (dataclasses.is_dataclass(scenario.options)
            and issubclass(scenario.options, opts.Options)):
        raise TypeError(f"scenario {scenario.name!r}: options must be a dataclass subclassing "
                        "fxtrack.scenarios.options.Options")
    SCENARIOS[scenario.name] = scenario
    metrics.declare(scenario.name, scenario.own_metrics)
    return scenario


def unregister(name: str) -> None:
    """Remove a scenario (a test's toy scenario)."""
    SCENARIOS.pop(name, None)
    metrics.declare(name, ())


def names() -> tuple[str, ...]:
    """The registered scenarios, in registration order (the report's order)."""
    return tuple(SCENARIOS)


def get(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(f"scenario={name} is not a registered scenario (registered: "
                       f"{', '.join(SCENARIOS)})") from None


def where(**flags: Any) -> tuple[str, ...]:
    """The names of the scenarios whose attributes equal ``flags`` (``where(deploys=True)``)."""
    return tuple(s.name for s in SCENARIOS.values()
                 if all(getattr(s, k) == v for k, v in flags.items()))


def objectives() -> tuple[Objective, ...]:
    """Every registered scenario's answer-page objectives, in page order, each naming its
    scenario."""
    found = [dataclasses.replace(o, scenario=s.name)
             for s in SCENARIOS.values() for o in s.objectives]
    return tuple(sorted(found, key=lambda o: o.rank))


def of_section(module: str) -> tuple[str, ...]:
    """The scenarios whose report section is ``module`` (``fxtrack.scenarios.fit.section``):
    the runs that section reads."""
    return tuple(s.name for s in SCENARIOS.values()
                 if "section" in s.parts and f"{s.package}.section" == module)


def with_part(name: str, function: Optional[str] = None) -> list[tuple[Scenario, Callable]]:
    """Each registered scenario with part ``name`` (and its ``function``), in registration
    order, with that function: the report's sections and charts, the sweep's closing tables."""
    found = ((s, s.part(name, function)) for s in SCENARIOS.values() if name in s.parts)
    return [(s, f) for s, f in found if f is not None]


def probe_tags() -> tuple[str, ...]:
    """The tags marking a run as another's probe (``Scenario.probe_tag``), every scenario's."""
    return tuple(s.probe_tag for s in SCENARIOS.values() if s.probe_tag)


def options_set(name: str, options: Any) -> tuple[str, ...]:
    """The options of ``options`` (scenario ``name``'s, typed or a dict) that ask for a
    capability (``Scenario.option_needs``) and are set."""
    scenario = SCENARIOS.get(name)
    get = options.get if isinstance(options, dict) else lambda k, d=None: getattr(options, k, d)
    return tuple(option for option, _ in (scenario.option_needs if scenario else ())
                 if get(option, None) not in (None, 0, False))


def options_of(spec: Any) -> opts.Options:
    """A JobSpec's typed options: the scenario's dataclass, from the JSON dict it crossed the
    process boundary as (idempotent)."""
    return opts.from_json(get(spec.scenario).options, spec.options)
