"""What crosses the process boundary between the orchestrator and its worker: the JobSpec the
orchestrator writes and the Result the worker writes back, both plain JSON so that the worker
needs neither Hydra nor MLflow, and the gate the worker waits at once its model is built."""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from pathlib import Path
from typing import Any, Optional


def _config(key: str, **kw: Any) -> Any:
    """A JobSpec field that is the resolved config's ``key`` (dotted), as it is there."""
    return dataclasses.field(metadata={"config": key}, **kw)


@dataclasses.dataclass
class JobSpec:
    """One job as the worker runs it: the resolved config's values it reads (each field marked
    ``_config`` names its key there, and ``from_config`` fills them all), the architecture, the
    scenario's options, where the result goes, and what the orchestrator decided for this run."""

    result_id: str  # unique per run; becomes the fxtrack.result_id tag
    framework: str = _config("framework.name")
    package: str = _config("framework.package")  # fxtrack.frameworks.<name>: its declaration
    scenario: str = _config("scenario.name")  # a driver's own runs change it (fit, scaling)
    runner: str  # "module:function" of the scenario
    arch: dict[str, Any]  # fxtrack.architectures.Arch.to_json()
    precision: str = _config("precision.name")  # fp32 | tf32 | bf16 | fp16
    hardware: str = _config("hardware.name")  # auto | cpu | gpu
    devices: int = _config("devices")  # a scaling sweep's runs change it
    compile: bool  # resolved in the worker from compile_request (fxtrack.policy) before build
    seed: int = _config("seed")
    # None: the model's default on the device (families.Model)
    batch_size: Optional[int] = _config("batch_size")
    steps: Optional[int] = _config("steps")
    warmup_steps: Optional[int] = _config("warmup_steps")
    result_path: str
    verbose: bool = _config("verbose", default=False)
    progress: bool = True
    launcher: str = _config("framework.launcher", default="process")  # FrameworkConfig.launcher
    nodes: int = _config("hardware.nodes", default=1)
    node_rank: int = _config("hardware.node_rank", default=0)
    coordinator: Optional[str] = _config("hardware.coordinator", default=None)  # node 0's host:port
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # scenario knobs
    # framework.compile as asked: auto | true | false
    compile_request: str = _config("framework.compile", default="auto")
    # None: the cores this process may use
    cpu_threads: Optional[int] = _config("hardware.cpu_threads", default=None)
    wait_for_idle_s: float = _config("hardware.wait_for_idle_s", default=0.0)
    # warn | error | wait
    gpu_isolation: str = _config("hardware.gpu_isolation", default="warn")
    repeat: int = 0  # which of `repeats` this worker is (fxtrack.repeat)
    parallel: str = _config("parallel", default="ddp")  # ddp | fsdp
    memory: str = _config("memory", default="none")  # none | checkpoint
    runtime: str = _config("runtime", default="native")  # inference runtime
    quantize: str = _config("quantize", default="none")  # none | dynamic_int8
    # framework.<key> of the keys only this framework declares (Framework.settings)
    framework_settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    # data.<key> (fxtrack.data): name, path, label, holdout; synthetic: today's batches
    data: dict[str, Any] = dataclasses.field(default_factory=lambda: {"name": "synthetic"})
    # model.from_run: the converge run whose trained weights scenario=inference evaluates
    # ({run_id, weights: the fetched file, eval_samples}); empty: the seeded start
    from_run: dict[str, Any] = dataclasses.field(default_factory=dict)
    # the device kind the orchestrator's refusal rules held for, before any process started;
    # None (unknown then: hardware=auto with a GPU; or a spec written by other means): the
    # worker runs them once it knows the kind
    refusals_checked: Optional[str] = None

    @classmethod
    def from_config(cls, config: Any, **rest: Any) -> "JobSpec":
        """The spec of a resolved config (any object whose attributes hold the keys: the typed
        config), every ``_config`` field read from its key (an enum as its value); ``rest``:
        the fields the config does not hold."""
        def at(key: str) -> Any:
            value = config
            for part in key.split("."):
                value = getattr(value, part)
            return value.value if isinstance(value, enum.Enum) else value

        return cls(**{f.name: at(f.metadata["config"]) for f in dataclasses.fields(cls)
                      if "config" in f.metadata}, **rest)

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2))

    @classmethod
    def read(cls, path: Path) -> "JobSpec":
        return cls(**json.loads(Path(path).read_text()))


@dataclasses.dataclass
class Result:
    result_id: str
    status: str = "FAILED"  # FINISHED | FAILED (the MLflow run status)
    error: Optional[str] = None  # one line, for the fxtrack.error tag
    guard: str = "ok"  # "ok" or why the correctness guard failed
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)  # keys carry their units
    series: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # per-step values
    # epoch ms of each value of the series sampled on a clock (system/...); the others' times
    # are derived from the step times (tracking.records.series_times)
    series_times_ms: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    # the step of each value of a series logged at chosen steps (scenario=converge's evaluations);
    # a series not named here is logged at steps 0, 1, 2, ...
    series_steps: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    tags: dict[str, str] = dataclasses.field(default_factory=dict)
    resolved: dict[str, Any] = dataclasses.field(default_factory=dict)  # defaults the worker chose
    # files the run leaves for the record, by role: "model" -> the exported deployment artefact
    # (ONNX or TFLite, its external data beside it), logged as an MLflow model
    artifacts: dict[str, str] = dataclasses.field(default_factory=dict)
    # windows of this run the orchestrator logs as its child runs (scenario=serve's rate-search
    # probes): each {"suffix": run-name suffix, "metrics", "tags", "series", "artifacts"}
    children: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2))

    @classmethod
    def read(cls, path: Path) -> "Result":
        return cls(**json.loads(Path(path).read_text()))


def children_path(result_path: str | Path) -> Path:
    """Where a worker writes each child window (a rate-search probe) the moment it ends, beside
    its result.json: a worker killed mid-search keeps the probes that finished (issue 43)."""
    return Path(result_path).with_name("children.jsonl")


def append_child(result_path: str | Path, child: dict[str, Any]) -> None:
    with children_path(result_path).open("a") as f:
        f.write(json.dumps(child) + "\n")


def streamed_children(result_path: str | Path) -> list[dict[str, Any]]:
    """The children a worker wrote one by one (a line cut short by a kill is left out)."""
    try:
        lines = children_path(result_path).read_text().splitlines()
    except OSError:
        return []
    children = []
    for line in lines:
        try:
            children.append(json.loads(line))
        except ValueError:
            break  # the last line, half written when the worker was killed
    return children


# The read end of a pipe from the orchestrator (runner.run_worker): the worker imports its
# framework and builds the model (nothing of it is timed), then waits at the gate while the
# orchestrator finishes loading MLflow, so that the two overlap without sharing the cores
# during the warm-up or the timed window.
GATE_ENV = "FXTRACK_GATE_FD"
# The orchestrator's pid: the worker stops when its parent is no longer it (worker.__main__).
PARENT_ENV = "FXTRACK_ORCHESTRATOR_PID"

_gate: Optional[str] = None  # the gate's descriptor, once take_gate() has it


class GateClosed(RuntimeError):
    """The orchestrator closed the gate without a word: it stopped, or died."""


def take_gate() -> None:
    """At the worker's start: the gate's file descriptor, out of the environment (so that no
    process this worker starts sees it), kept for ``pass_gate``."""
    global _gate
    _gate = os.environ.pop(GATE_ENV, None)


def pass_gate() -> None:
    """Where a scenario has built its model and times nothing yet: wait once at the
    orchestrator's gate, if it set one (later calls, and a worker without a gate, go on at
    once). Raises GateClosed when it closed the gate without a word: nothing to run for."""
    global _gate
    fd, _gate = _gate, None
    if fd is None:
        return
    try:
        with os.fdopen(int(fd), "rb", buffering=0) as gate:
            went = gate.read(1) == b"1"
    except (OSError, ValueError):  # not a pipe from us after all: nothing to wait for
        return
    if not went:
        raise GateClosed("the orchestrator stopped before the run started")
