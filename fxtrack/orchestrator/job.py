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
from fxtrack.worker.protocol import JobSpec, Result, children_path, streamed_children
from fxtrack.measure.host_load import is_contended
from fxtrack.orchestrator import from_run
from fxtrack.orchestrator.runner import log_tail, run_worker
from fxtrack.tracking.records import HEADLINE, NOISY_CV


def job_spec(conf: FxtrackConfig, arch: architectures.Arch, job_dir: Path) -> JobSpec:
    fw = conf.framework
    return JobSpec(
        result_id=uuid.uuid4().hex, framework=fw.name, package=fw.package,
        scenario=conf.scenario.name, runner=scenarios.get(conf.scenario.name).runner_path,
        arch=arch.to_json(),
        precision=conf.precision.name, hardware=conf.hardware.name, devices=conf.devices,
        compile=fw.compile != "false", compile_request=fw.compile,
        seed=conf.seed, batch_size=conf.batch_size, steps=conf.steps,
        warmup_steps=conf.warmup_steps, result_path=str(job_dir / "result.json"),
        verbose=conf.verbose, progress=sys.stderr.isatty() or bool(os.environ.get("FXTRACK_PROGRESS")),
        launcher=fw.launcher, nodes=conf.hardware.nodes, node_rank=conf.hardware.node_rank,
        coordinator=conf.hardware.coordinator, cpu_threads=conf.hardware.cpu_threads,
        wait_for_idle_s=conf.hardware.wait_for_idle_s,
        gpu_isolation=conf.hardware.gpu_isolation, parallel=conf.parallel.value,
        memory=conf.memory.value, runtime=conf.runtime.value, quantize=conf.quantize.value,
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


# The parent's tags a child window copies: what ran (device, versions, compile mode), so the
# child reads as the same configuration in the UI; its scenario's own besides (child_tags).
_CHILD_TAGS = ("device", "framework_version", "python", "cuda", "cudnn", "compile_rule",
               "compile_mode", "compile_decision", "attention", "matmul_precision",
               "cpu_threads", "contended")

_LOADED: set[str] = set()  # tracking URIs whose MLflow client this process has opened
# result id -> the held fallback of a parent this process opened (hold_parent). Process-wide: a
# repeats sweep opens an aggregate in one cell's Job and closes it in another's (issue 60).
_HELD_PARENTS: dict[str, Path] = {}


class Job:
    """One composed config, ready to run as a worker (at any device count) and be logged."""

    def __init__(self, cfg: DictConfig, conf: FxtrackConfig, arch: architectures.Arch,
                 launch_dir: str) -> None:
        from fxtrack.tracking import records, target

        self.cfg, self.conf, self.arch = cfg, conf, arch
        if not conf.verbose:  # MLflow's database-migration chatter is noise to a user
            for name in ("mlflow", "alembic"):
                logging.getLogger(name).setLevel(logging.WARNING)
        self.uri = target.tracking_uri(conf.tracking.uri, launch_dir)
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
        children = _Children(self, spec, config, name) if spec.node_rank == 0 else None
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
            self.load_tracking()

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
            summary = summary_line(name, result)
            opened = records.with_context(opened)  # a worker that never started: meanwhile did not run
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
            run_id, where = self.log(record, artifacts)
            print(f"{summary}  [{where}]", file=sys.stderr, flush=True)
            self.log_children(spec, result, config, name, children)
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
            int(time.time() * 1000), name, summary_line(name, result))
        return self.log(record, {"config.yaml": OmegaConf.to_yaml(OmegaConf.create(config))})[0]

    def hold(self, spec: JobSpec, job_dir: Path, config: dict, opened: dict) -> Path | None:
        """The run's fallback in the spool while its worker runs (``spool.hold``): if this
        process is killed outright, ``fxtrack sync`` logs the worker's finished result, or the
        run FAILED with why, once (the worker stops with this process). Held again, the same
        entry is replaced (one per result id and process); ``opened``: the run's open record."""
        from fxtrack.tracking import records, spool

        failed = Result(spec.result_id, status="FAILED", error=records.GONE,
                        tags={"config_id": config_id(config)})
        record = records.close_record(opened, spec, failed,
                                      f"{opened['run_name']}: FAILED: {records.GONE}")
        try:
            return spool.hold(records.held_job(record, str(job_dir), config),
                              {"config.yaml": OmegaConf.to_yaml(OmegaConf.create(config)),
                               "environment.json": records.environment_json()})
        except spool.SpoolError as e:  # the run goes on; only a kill would need the fallback
            print(f"fxtrack: no fallback for this run in the spool ({e})", file=sys.stderr)
            return None

    def log_children(self, spec: JobSpec, result: Result, config: dict, name: str,
                     kept: "_Children | None" = None) -> None:
        """The run's windows (Result.children: scenario=serve's rate-search probes) as child
        runs of it, each with its own figures, verdict and per-request records; tagged with its
        scenario's ``probe_tag`` so the report counts them through their parent. Each was
        held in the spool as it ended (``kept``): logged now under the same result id, so a
        sync after a kill cannot log one twice."""
        copied = _CHILD_TAGS + scenarios.get(spec.scenario).child_tags
        tags = {k: v for k, v in result.tags.items() if k in copied}
        for i, child in enumerate(result.children):
            result_id = kept.result_id(i) if kept is not None else uuid.uuid4().hex
            record, files = child_record(self, spec, child, tags, result.resolved, config,
                                         name, result_id)
            self.log(record, files)
        if kept is not None:
            kept.drop()

    def load_tracking(self) -> None:
        """MLflow imported and the store opened (the embedded store created or migrated) for
        the log after the run; done while the worker starts (run_worker's ``meanwhile``). A
        failure here is left to the log, which classifies it and spools the result."""
        if self.uri in _LOADED:
            return
        _LOADED.add(self.uri)
        try:
            from fxtrack.tracking import runs

            runs.client_for(self.uri)
        except Exception:  # noqa: BLE001 - the log after the run reports it
            pass

    def log(self, record: dict, artifacts: dict) -> tuple[str | None, str]:
        """Spool ``record``, deliver it (directly if it cannot be spooled); (run id or None,
        where it went)."""
        from fxtrack.tracking import writer

        run_id, where, message = writer.log_record(record, artifacts, self.uri)
        if message:
            print(message, file=sys.stderr)
        if record["kind"] == "sweep":  # a parent: fit's search, scaling, a repeats aggregate
            self.hold_parent(record)
        return run_id, where

    def hold_parent(self, record: dict) -> None:
        """While a parent run is RUNNING, its FAILED closing record waits in the spool
        (``spool.hold``): if this process is killed outright, ``fxtrack sync`` closes it with
        why instead of leaving it RUNNING for ever; its own closing record drops it."""
        from fxtrack.tracking import records, spool

        spool.drop(_HELD_PARENTS.pop(record["result_id"], None))
        if record["status"] != "RUNNING":
            return
        gone = records.fallback(dict(record, status="FAILED", tags=dict(
            record["tags"], **{"fxtrack.status": "failed", "fxtrack.error": records.GONE_PARENT})))
        try:
            _HELD_PARENTS[record["result_id"]] = spool.hold(gone, {})
        except spool.SpoolError as e:
            print(f"fxtrack: no fallback for {record['run_name']} in the spool ({e})",
                  file=sys.stderr)


def child_record(job: "Job", spec: JobSpec, child: dict, parent_tags: dict[str, str],
                 resolved: dict, config: dict, name: str, result_id: str
                 ) -> tuple[dict, dict[str, Path]]:
    """One streamed window (a serve probe) as a child run's record and files."""
    from fxtrack.tracking import records

    child_spec = dataclasses.replace(spec, result_id=result_id)
    tags = dict(parent_tags)
    tags.update(child["tags"], **{scenarios.get(spec.scenario).probe_tag: spec.result_id})
    # a window that ended is a finished run, whatever stopped its parent afterwards
    child_result = Result(result_id, status="FINISHED", metrics=dict(child["metrics"]),
                          series=dict(child["series"]), tags=tags, resolved=resolved)
    child_name = f"{name}-{child['suffix']}"
    now = int(time.time() * 1000)
    record = records.job_record(child_spec, child_result, config, job.uri,
                                job.conf.tracking.experiment, spec.result_id,
                                child.get("start_time_ms") or now, child_name,
                                summary_line(child_name, child_result))
    record["end_time_ms"] = child.get("end_time_ms") or now  # the window's own span
    files = {f"{role}.json": Path(path) for role, path in child["artifacts"].items()}
    return record, files


class _Children:
    """A run's streamed children (``children.jsonl``: serve's probe windows), each held in
    the spool the moment the worker writes it: if this process is then killed outright,
    ``fxtrack sync`` logs every finished probe as a child of the run (issue 41 item 3)."""

    def __init__(self, job: "Job", spec: JobSpec, config: dict, name: str) -> None:
        self.job, self.spec, self.config, self.name = job, spec, config, name
        self.path = children_path(spec.result_path)
        self.ids: list[str] = []
        self.held: list[Path] = []

    def result_id(self, index: int) -> str:
        while len(self.ids) <= index:
            self.ids.append(uuid.uuid4().hex)
        return self.ids[index]

    def keep(self) -> None:
        """Hold each child written since the last call (run_worker's ``while_running``)."""
        from fxtrack.tracking import spool

        if not self.path.is_file():
            return
        streamed = streamed_children(self.spec.result_path)
        for i in range(len(self.held), len(streamed)):
            record, files = child_record(self.job, self.spec, streamed[i], {}, {}, self.config,
                                         self.name, self.result_id(i))
            try:
                self.held.append(spool.hold(record, files))
            except spool.SpoolError as e:  # the run goes on; it logs its children at the end
                print(f"fxtrack: no fallback for the run's children in the spool ({e})",
                      file=sys.stderr)
                self.path = Path(os.devnull)  # not asked again: is_file() is False
                return

    def drop(self) -> None:
        from fxtrack.tracking import spool

        for held in self.held:
            spool.drop(held)
        self.held = []


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


def summary_line(name: str, result: Result) -> str:
    """One line per run: status and the headline figures its scenario logged."""
    if result.status != "FINISHED":
        return f"{name}: {result.status}: {result.error}"
    m = result.metrics
    parts = [fmt.format(m[key]) for key, fmt in HEADLINE if key in m]
    source = result.tags.get("peak_tflops_source", "")
    if "mfu" in m and source.startswith("machine-best:"):  # say which yardstick the MFU is on
        parts[-1] += f" (of this machine's best matmul rate, {source.partition(':')[2]}'s)"
    notes = "" if result.guard == "ok" else f"  WARNING: correctness guard: {result.guard}"
    if m.get("mfu", 0.0) > 1.0:  # impossible: the peak or the FLOP count is wrong
        notes += (f"  WARNING: MFU {m['mfu']:.0%} > 100%: peak {m.get('peak_tflops', 0):.1f} "
                  f"TFLOP/s ({result.tags.get('peak_tflops_source', '?')}) is below this run's rate")
    if result.tags.get("peak_contended") == "true":
        notes += ("  NOTE: no MFU: the peak FLOP/s was calibrated while other processes used the "
                  "cores (not cached; a quiet run calibrates again)")
    if m.get("reached_target") == 0.0:  # scenario=converge: FINISHED, the target not met
        notes += "  NOTE: target not reached within the budget"
    if result.tags.get("trajectory", "").startswith("diverged"):
        notes += (f"  NOTE: training losses {result.tags['trajectory']} from "
                  f"{result.tags.get('trajectory_reference')}'s")
    if m.get("step_time_cv", 0.0) > NOISY_CV:
        notes += f"  NOTE: noisy: step times vary {m['step_time_cv']:.0%} (CV > {NOISY_CV:.0%})"
    if is_contended(m.get("host_other_cpu_frac")):
        notes += (f"  CONTENDED: other processes took {m['host_other_cpu_frac']:.0%} of the "
                  "cores during the timed window")
    foreign = result.tags.get("gpu_foreign_processes") or result.tags.get("gpu_foreign_processes_before")
    if foreign:
        notes += f"  CONTENDED: other processes on the run's GPUs ({foreign})"
    if result.tags.get("gpu_throttled"):
        notes += f"  THROTTLED: the GPU slowed its clocks ({result.tags['gpu_throttled']})"
    return f"{name}: " + ", ".join(parts) + notes
