"""One composed config as a job: its JobSpec, run in a worker at any device count, enriched
with MFU and code metrics, logged, and summed up in one line."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, OmegaConf

from fxtrack import architectures, families, scenarios
from fxtrack.config.schema import FxtrackConfig
from fxtrack.config.validate import expected_device_kind
from fxtrack.frameworks.declaration import declaration
from fxtrack.worker.protocol import JobSpec, Result
from fxtrack.orchestrator import from_run
from fxtrack.orchestrator.runner import log_tail, run_worker
from fxtrack.tracking.tracker import Tracker


def job_spec(conf: FxtrackConfig, arch: architectures.Arch, job_dir: Path) -> JobSpec:
    """The worker's spec of ``conf``: its values where JobSpec names their keys, and what the
    config does not hold (the run's id, runner, architecture, result path, the resolved
    compile choice, the framework's own settings, the refusal rules' device kind)."""
    fw = conf.framework
    return JobSpec.from_config(
        conf, result_id=uuid.uuid4().hex, runner=scenarios.get(conf.scenario.name).runner_path,
        arch=arch.to_json(), compile=fw.compile != "false",
        result_path=str(job_dir / "result.json"),
        progress=sys.stderr.isatty() or bool(os.environ.get("FXTRACK_PROGRESS")),
        options=conf.scenario,  # the scenario's typed options; JSON across the boundary
        framework_settings={key: getattr(fw, key) for key in declaration(fw.package).settings},
        data=dataclasses.asdict(conf.data),
        refusals_checked=expected_device_kind(conf.hardware.name),  # validate's refusal ran
    )


def stop_if_interrupted() -> None:
    """After a signal stopped the worker (and its KILLED run was logged): close the sweep's
    parent KILLED and exit 128+signal (130 for Ctrl-C, 143 for SIGTERM), no traceback."""
    from fxtrack.orchestrator.runner import interrupted

    sig = interrupted()
    if sig is None:
        return
    if os.environ.get("SUBMITIT_EXECUTOR"):
        # This process is one job that SLURM is stopping (scancel, time limit); SIGKILL follows
        # after KillWait. Ending normally lets submitit write the job's result, so the sweep's
        # launcher collects it and the other jobs go on (an exit leaves submitit waiting on a
        # job with no result: forever, where sacct cannot answer).
        print(f"fxtrack: this SLURM job was stopped by signal {sig}; its run is recorded as "
              "KILLED", file=sys.stderr, flush=True)
        return
    from fxtrack.orchestrator import sweep

    # a repeats sweep's open aggregates close KILLED with their finished repeats' figures, not
    # RUNNING until a sync closed them FAILED (issue 60)
    closed = sweep.close_interrupted("KILLED", f"interrupted by signal {sig}")
    print(f"fxtrack: interrupted by signal {sig}; the run was recorded as KILLED"
          + (f", and {len(closed)} repeats aggregate(s) KILLED with their finished repeats "
             "(resume=true runs only the missing repeats)" if closed else ""),
          file=sys.stderr, flush=True)
    sys.exit(128 + sig)


class Job:
    """One composed config, ready to run as a worker (at any device count) and be logged."""

    def __init__(self, cfg: DictConfig, conf: FxtrackConfig, arch: architectures.Arch,
                 launch_dir: str) -> None:
        from fxtrack.tracking import records, target

        self.conf, self.arch = conf, arch  # the typed config; ``config`` below: as logged
        if not conf.verbose:  # MLflow's database-migration chatter is noise to a user
            for name in ("mlflow", "alembic"):
                logging.getLogger(name).setLevel(logging.WARNING)
        self.uri = target.tracking_uri(conf.tracking.uri, launch_dir)
        self.tracker = Tracker(self.uri, conf.tracking.experiment)
        config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
        config["tracking"]["uri"] = records.redact_uri_text(config["tracking"]["uri"] or "") or None
        # the interpreter the worker runs under (runner.run_worker: this one unless set)
        config["framework"]["python"] = conf.framework.python or sys.executable
        # the dims that ran: data=<name> sets the input size and classes after model.* was
        # composed (validate.data_dims), so the arch's values are logged, not the table's
        for key in families.of(arch).size_keys:
            if key in config["model"] and key in arch.dims:
                config["model"][key] = arch.dims[key]
        self.config = config  # what is logged: resolved, without credentials
        self.last_record: dict | None = None  # the latest run's record (tags, params), for repeats

    def run(self, job_dir: Path, parent: str | None, devices: int,
            scenario: str | None = None, repeat: int | None = None,
            tags: Callable[[Result], dict[str, str]] | None = None
            ) -> tuple[str, Result, str | None]:
        """Run the worker at ``devices``, enrich, log; returns (run name, Result, run id).
        ``repeat``: which of ``repeats`` this run is (its parent is then the config's aggregate).
        ``tags``: the caller's own tags from the Result, before it is logged (a fit probe's)."""
        from fxtrack.tracking import records, spool

        spec = job_spec(self.conf, self.arch, job_dir)
        if (devices, scenario or spec.scenario) != (spec.devices, spec.scenario):
            spec.refusals_checked = None  # validate checked the config's own: the worker checks
        spec.devices = devices
        spec.scenario = scenario or spec.scenario
        if repeat is not None:
            spec.repeat = repeat
        spec.from_run = from_run.spec_of(self.conf, self.uri, job_dir)  # its weights fetched
        name = records.run_name(spec, self.conf.size.name, repeat)
        start_ms = int(time.time() * 1000)
        config = dict(self.config, devices=devices)
        # only node 0 talks to MLflow
        children = self.tracker.children(spec, config, name) if spec.node_rank == 0 else None
        # The run's record is opened once. Its FAILED fallback is held before the worker exists
        # (a kill must never leave a worker's run unrecorded), first without MLflow's
        # run-context tags, whose import (0.8 s) had delayed every job; meanwhile, while the
        # worker imports and builds behind its gate, they are added and the entry rewritten.
        opened = records.open_record(spec, config, self.uri, self.conf.tracking.experiment,
                                     parent, start_ms, name, context=False)
        holding: list[Path | None] = [None]
        if spec.node_rank == 0:
            holding[0] = self.hold(spec, job_dir, config, opened)

        def meanwhile() -> None:
            nonlocal opened
            opened = records.with_context(opened)
            if spec.node_rank == 0 and holding[0] is not None:
                holding[0] = self.hold(spec, job_dir, config, opened) or holding[0]
            self.tracker.load()

        try:
            result = run_worker(spec, job_dir, self.conf.framework.python, self.conf.timeout_s,
                                meanwhile=meanwhile,
                                while_running=None if children is None else children.keep)
            held = holding[0]
            if spec.node_rank != 0:  # only node 0 talks to MLflow; its Result covers every node
                print(f"{name}: node {spec.node_rank} {result.status.lower()}"
                      + (f": {result.error}" if result.error else ""), file=sys.stderr, flush=True)
                return name, result, "node"
            if result.status == "FINISHED":
                enrich(result, spec, self.conf)
                cross_check(result, spec)
            if repeat is not None and tags is None:  # -> fxtrack.repeat, fxtrack.repeat_of (the
                result.tags.update(repeat=str(repeat), repeat_of=parent or "")  # report skips these)
            if tags is not None:
                result.tags.update(tags(result))
            result.tags["config_id"] = config_id(config)
            result.dump(Path(spec.result_path))  # the final word, timeouts and signals included
            summary = records.summary_line(name, result)
            # a worker that never started: meanwhile did not run
            opened = records.with_context(opened)
            self.last_record = record = records.close_record(opened, spec, result, summary)
            artifacts = {"config.yaml": OmegaConf.to_yaml(OmegaConf.create(config)),
                         "result.json": Path(spec.result_path),
                         "environment.json": records.environment_json(),
                         "worker.log": log_tail(job_dir / "worker.log")}
            if record["logged_model"]:  # the kept model's folder (deploy._keep, converge)
                artifacts["model"] = Path(result.artifacts.get("model")
                                          or result.artifacts["weights"]).parent
            for role in scenarios.get(spec.scenario).artifacts:  # serve's per-request rows
                if role in result.artifacts:
                    artifacts[f"{role}.json"] = Path(result.artifacts[role])
            run_id, where = self.tracker.log(record, artifacts)
            print(f"{summary}  [{where}]", file=sys.stderr, flush=True)
            self.tracker.log_children(spec, result, config, name, children)
            spool.drop(held)
        except Exception:  # an error of this process's own: no fallback saying it was killed
            spool.drop(holding[0])
            if children is not None:
                children.drop()
            raise
        stop_if_interrupted()
        return name, result, run_id

    def log_failed(self, job_dir: Path, parent: str | None, error: str) -> str | None:
        """A FAILED run for a cell whose own orchestrator code raised before it logged one."""
        from fxtrack.tracking import records

        spec = job_spec(self.conf, self.arch, job_dir)
        name = records.run_name(spec, self.conf.size.name)
        config = dict(self.config, devices=self.conf.devices)
        result = Result(spec.result_id, status="FAILED", error=error,
                        tags={"config_id": config_id(config)})
        self.last_record = record = records.job_record(
            spec, result, config, self.uri, self.conf.tracking.experiment, parent,
            int(time.time() * 1000), name, records.summary_line(name, result))
        files = {"config.yaml": OmegaConf.to_yaml(OmegaConf.create(config))}
        return self.tracker.log(record, files)[0]

    def hold(self, spec: JobSpec, job_dir: Path, config: dict, opened: dict) -> Path | None:
        """The run's fallback in the spool while its worker runs (``spool.hold``): if this
        process is killed outright, ``fxtrack sync`` logs the worker's finished result, or the
        run FAILED with why, once (the worker stops with this process). Held again, the same
        entry is replaced (one per result id and process); ``opened``: the run's open record."""
        from fxtrack.tracking import records

        failed = Result(spec.result_id, status="FAILED", error=records.GONE,
                        tags={"config_id": config_id(config)})
        record = records.close_record(opened, spec, failed,
                                      f"{opened['run_name']}: FAILED: {records.GONE}")
        return self.tracker.hold(record, job_dir, config,
                                 {"config.yaml": OmegaConf.to_yaml(OmegaConf.create(config)),
                                  "environment.json": records.environment_json()})


# keys that do not change what is measured: where it is logged, how it is shown, when to stop
_NOT_IDENTITY = ("tracking", "resume", "verbose", "timeout_s")


def config_id(config: dict) -> str:
    """A run's configuration as one id (tag ``fxtrack.config_id``): ``resume=true`` skips a run
    whose id already has a FINISHED run in the store."""
    import hashlib
    import json

    same = {k: v for k, v in config.items() if k not in _NOT_IDENTITY}
    return hashlib.sha256(json.dumps(same, sort_keys=True, default=str).encode()).hexdigest()[:16]


# what a scenario's cross-check keeps between the runs of this process (a sweep's jobs, in order)
_CROSS_CHECKED: dict = {}


def cross_check(result: Result, spec: JobSpec) -> None:
    """The scenario's check of this run against earlier ones of the sweep, if it has one."""
    check = scenarios.get(spec.scenario).part("check", "cross_check")
    if check is not None:
        check(result, spec, _CROSS_CHECKED)


def enrich(result: Result, spec: JobSpec, conf: FxtrackConfig) -> None:
    """Figures the orchestrator adds: MFU against the one peak per device and precision, and the
    cost per 1M samples (tokens). (Code size is the same on every run of a framework: the sweep's
    parent and the report carry it, fxtrack.measure.complexity.)"""
    from fxtrack.measure import cost
    from fxtrack.orchestrator import calibration

    m = result.metrics
    user = families.of(spec.arch).user
    model_code = None if user is None else user.model_code
    if model_code is not None:  # e.g. a user's model: its builder's module is its model code,
        from fxtrack.measure import complexity  # which differs run to run (fxtrack's own does not)

        builder = model_code(spec.arch["dims"], declaration(spec.package).builder_key)
        m.update(complexity.code_metrics(spec.framework, builder))
    m.update(cost.cost_metrics(conf.hardware.price_per_hour, spec.devices, spec.nodes, m))
    if "achieved_tflops" not in m:  # e.g. checkpoint: no timed compute, no MFU
        return
    if spec.quantize != "none":  # int8 matmuls against the float peak: no meaningful MFU (a
        return  # dynamic_int8 BERT on CPU read 185%); achieved_tflops stays, for the record
    device = result.tags.get("device", result.resolved.get("device_kind", "cpu"))
    hardware = result.resolved.get("device_kind", spec.hardware)
    mfu, tags = calibration.mfu_metrics(spec.framework, device, spec.precision, hardware,
                                        spec.devices * spec.nodes, m["achieved_tflops"],
                                        {spec.framework: conf.framework.python},
                                        spec.cpu_threads)
    m.update(mfu)
    result.tags.update(tags)  # peak_tflops_source, peak_calibrated, mfu_over_1, peak_contended
