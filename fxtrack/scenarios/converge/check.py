"""scenario=converge's checks, in the config layer (``check``: before any work) and for the
orchestrator (``cross_check``: each finished run against earlier ones of the sweep). Neither
imports above the config layer; the orchestrator asks for them through ``Scenario.part``."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from fxtrack import data
from fxtrack.worker.protocol import Result
from fxtrack.scenarios.converge import runner
from fxtrack.scenarios.registry import options_of


def check(conf: Any, arch: Any) -> Optional[str]:
    """Before any work (the config layer's check): more than one node (each process would need
    its own slice of the host batch: JAX's processes read theirs, not the global one), a batch
    the devices do not divide, or an option neither set nor declared by the family for this
    dataset, one line; None when the run may go. (A framework whose converge step cannot split
    a batch over devices is refused by its declaration: ``converge_devices``.)"""
    if conf.hardware.nodes > 1:
        return ("scenario=converge runs on one node: set hardware.nodes=1 (devices on one "
                "machine split each batch)")
    spec = dataclasses.replace(runner.SettingsOf(), arch=arch.to_json(), data=dataclasses.asdict(conf.data),
                               batch_size=conf.batch_size)
    try:
        batch = runner.settings(spec, conf.scenario)["batch_size"]
    except ValueError as e:
        return str(e)
    why = runner.too_few(data.load(conf.data), int(arch.dims.get("seq_len", 1)), batch)
    if why is not None:
        return why
    if batch % conf.devices:  # batch_size is the global batch: each device takes 1/devices
        return (f"scenario=converge splits each batch of {batch} over devices={conf.devices}, "
                f"which does not divide it; set batch_size to a multiple of {conf.devices}")
    return None


def cross_check(result: Result, spec: Any, held: dict) -> None:
    """Checks of this run against earlier runs of this process (a sweep's earlier cells, on the
    same model, data, seed, batch and options): the trajectory (``trajectory_check``) and a
    lever's quality (``lever_check``)."""
    if "loss" not in result.series:
        return
    options = options_of(spec)
    same = repr((spec.arch, spec.data, runner.run_seed(spec), result.resolved.get("batch_size"),
                 sorted(vars(options).items())))
    lever_check(result, spec, held, same, options)
    if spec.precision == "fp32":
        trajectory_check(result, spec, held, repr((same, spec.parallel, spec.memory)), options)


def trajectory_check(result: Result, spec: Any, held: dict, key: str, options: Any) -> None:
    """At fp32, the first ``scenario.trajectory_steps`` training losses against those of the
    first framework that ran the same configuration: ``loss_divergence_max`` and the
    ``trajectory`` tag (``matched`` / ``diverged@<step>``; the first framework's run:
    ``reference``)."""
    losses = result.series["loss"][:options.trajectory_steps]
    first = held.setdefault(("trajectory", key), (spec.framework, losses))
    if first[0] == spec.framework:
        result.tags["trajectory"] = "reference"
        return
    worst, tag = runner.trajectory(losses, first[1], options.trajectory_tol)
    result.metrics["loss_divergence_max"] = worst
    result.tags["trajectory"] = tag
    result.tags["trajectory_reference"] = first[0]


def is_baseline(spec: Any) -> bool:
    """fp32 with no lever: no sharding, no recomputation, the compile rule's own choice and the
    framework's default settings (the run a lever is compared with)."""
    from fxtrack.frameworks.declaration import declaration

    settings = declaration(spec.package).settings
    return (spec.precision == "fp32" and spec.parallel == "ddp" and spec.memory == "none"
            and spec.compile_request == "auto"
            and all(spec.framework_settings.get(k, v.default) == v.default
                    for k, v in settings.items()))


def lever_check(result: Result, spec: Any, held: dict, key: str, options: Any) -> None:
    """A lever's run (bf16, a compile mode, fsdp, checkpointing) against the same framework's
    fp32 baseline earlier in the sweep: ``final_eval_vs_fp32`` (signed, in the metric's units,
    positive is better), ``time_to_target_x_fp32`` and the ``lever_quality`` tag: ``kept``,
    ``lost`` (worse by more than ``scenario.quality_tol``) or ``no fp32 baseline``."""
    metric = result.resolved["metric"]
    final = result.metrics.get(f"final_eval_{metric}")
    if final is None:  # never evaluated (its loss went NaN first): nothing to compare
        return
    mine = (final, result.metrics.get("time_to_target_s"))
    if is_baseline(spec):
        held.setdefault(("baseline", spec.framework, key), mine)
        return
    base = held.get(("baseline", spec.framework, key))
    if base is None:
        result.tags["lever_quality"] = "no fp32 baseline"
        return
    better = (final - base[0]) if runner.HIGHER_IS_BETTER[metric] else (base[0] - final)
    result.metrics["final_eval_vs_fp32"] = better
    if mine[1] is not None and base[1]:
        result.metrics["time_to_target_x_fp32"] = mine[1] / base[1]
    result.tags["lever_quality"] = "lost" if better < -options.quality_tol else "kept"
