"""Which combinations of run levers have a path: the one table both sides read.

The orchestrator checks a config against it before any worker starts (``fxtrack.config.validate``:
a single run stops with exit 2, a sweep skips the cell); the worker checks the same rules again
(``scenarios.deploy.check_supported``) as a backstop, with the same message and the framework's
version. The rules are a scenario's own (``Scenario.rules`` and ``Scenario.capability``, in its
folder), the framework-neutral ones (``RULES``: what a runtime or a lever needs) and each
framework's declaration (a capability it lacks, a ``Limit`` it declares). No scenario is named
here: what differs by scenario is asked of its spec.

Imports no framework: a declaration never does.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from fxtrack import families
from fxtrack.frameworks import user_builder
from fxtrack.scenarios import registry
from fxtrack.scenarios.registry import Rule, deploy_levers, is_deploy
from fxtrack.frameworks.declaration import LEVERS, Framework

ONNX_RUNTIMES = ("onnxruntime", "openvino", "tensorrt")  # they serve an ONNX file
EXPORT_PRECISIONS = ("fp32", "tf32")  # what an exported artefact holds


@dataclasses.dataclass(frozen=True)
class Combination:
    """The keys the rules read. ``device_kind`` is ``cpu`` or ``gpu``, or None where it is not
    known before the framework starts (``hardware=auto`` on a machine with an NVIDIA GPU: the
    framework may still not see it); a rule about the device kind is then left to the worker."""

    framework: str
    scenario: str
    precision: str
    parallel: str = "ddp"
    memory: str = "none"
    runtime: str = "native"
    quantize: str = "none"
    devices: int = 1
    nodes: int = 1
    device_kind: Optional[str] = None
    family: str = ""  # the model family (fxtrack.families); "": not known (no family rule)
    # the scenario's options set that ask for a capability (registry.options_set)
    options_set: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: Any, device_kind: Optional[str]) -> "Combination":
        """From anything with the JobSpec's field names (a JobSpec)."""
        return cls(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(cls)
                      if f.name not in ("device_kind", "family", "options_set")},
                   device_kind=device_kind, family=spec.arch["family"],
                   options_set=registry.options_set(spec.scenario, spec.options))


def _spec(c: Combination) -> Optional[families.Family]:
    return families.get(c.family) if c.family else None


# The framework-neutral rules, in the order they are checked (the first that holds is reported).
RULES: tuple[Rule, ...] = (
    Rule(lambda c: f"{deploy_levers(c)} with scenario={c.scenario}",
         lambda c: is_deploy(c) and not _deploys(c),
         "a deployment runtime or quantisation serves a model for inference only; add "
         "scenario=inference, or drop the runtime/quantize override"),
    Rule(lambda c: f"parallel=fsdp with devices={c.devices}",
         # a device sweep's x1 child is its baseline: the same sharded step on one device
         lambda c: c.parallel == "fsdp" and c.devices * c.nodes < 2 and not _sweeps_devices(c),
         "sharding needs more than one device; set devices=2 or more, or parallel=ddp"),
    Rule(lambda c: f"runtime={c.runtime} with precision={c.precision}",
         lambda c: c.runtime != "native" and c.precision not in EXPORT_PRECISIONS,
         "exported artefacts are fp32; use precision=fp32 (or quantize=dynamic_int8)"),
    Rule(lambda c: "runtime=tensorrt with quantize=dynamic_int8",
         lambda c: c.runtime == "tensorrt" and c.quantize == "dynamic_int8",
         "TensorRT's int8 is static (calibrated); use quantize=none"),
    Rule(lambda c: "runtime=tensorrt on a CPU",
         lambda c: c.runtime == "tensorrt" and c.device_kind == "cpu",
         "TensorRT needs an NVIDIA GPU (it has no CPU path); on a CPU use runtime=onnxruntime "
         "or runtime=openvino"),
)


def _deploys(c: Combination) -> bool:
    scenario = registry.SCENARIOS.get(c.scenario)
    return scenario is not None and scenario.deploys


def _sweeps_devices(c: Combination) -> bool:
    scenario = registry.SCENARIOS.get(c.scenario)
    return scenario is not None and scenario.sweeps_devices


def export_capability(c: Any) -> str:
    """The deployment-export capability a deployment run (runtime, quantize) needs, for any
    family (a framework that cannot export a user's model with it says so in a Limit)."""
    if c.runtime == "native":  # quantize=dynamic_int8 in the framework itself
        return "native_int8"
    if c.runtime == "tflite":
        return "tflite_export"
    if c.runtime in ONNX_RUNTIMES:
        return "onnx_export"
    raise ValueError(f"runtime={c.runtime}: no deployment export serves it")


def refusal(c: Combination, framework: Framework, version: Optional[str] = None
            ) -> Optional[str]:
    """Why ``c`` has no path (one line naming the fix), or None when it may run."""
    by = f"{framework.name} {version}" if version else framework.name
    scenario = registry.SCENARIOS.get(c.scenario)
    for rule in (*(scenario.rules if scenario is not None else ()), *RULES):
        if rule.when(c):
            return f"{rule.what(c)} is not supported by {by}: {rule.why}"
    for (field, value), capability in LEVERS.items():
        if getattr(c, field) == value and not framework.has(capability):
            return str(framework.unsupported(capability, f"{field}={value}", version))
    spec = _spec(c)
    user = spec is not None and spec.user is not None
    if scenario is not None and scenario.deploys and is_deploy(c):
        needed = export_capability(c)
        if not framework.has(needed):
            what = ("quantize=dynamic_int8 with runtime=native" if c.runtime == "native"
                    else f"runtime={c.runtime}") + (" with model=custom" if user else "")
            return str(framework.unsupported(needed, what, version))
    need = scenario.capability(c) if scenario is not None and scenario.capability else None
    if need is not None and not framework.has(need[0]):
        return str(framework.unsupported(need[0], need[1], version))
    for needed in scenario.needs if scenario is not None else ():  # e.g. keras' pipeline
        if not framework.has(needed):
            return str(framework.unsupported(needed, f"scenario={c.scenario}", version))
    for option, needed in scenario.option_needs if scenario is not None else ():
        if option in c.options_set and not framework.has(needed):
            return str(framework.unsupported(needed, f"scenario.{option} with scenario="
                                             f"{c.scenario}", version))
    if scenario is not None and scenario.devices_need and c.devices * c.nodes > 1 \
            and not framework.has(scenario.devices_need):
        return str(framework.unsupported(scenario.devices_need, f"scenario={c.scenario} with "
                                         f"devices={c.devices * c.nodes}", version))
    for limit in framework.limits:
        if limit.when(c):
            return f"{limit.describe(c)} is not supported by {by}: {limit.why}"
    if user:  # the levers fxtrack cannot apply to an arbitrary model
        return user_builder.refusal(c.scenario, c.memory, c.parallel, framework.has)
    return None
