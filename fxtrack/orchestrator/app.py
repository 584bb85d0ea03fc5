"""The Hydra task: validate the config, run the job in a worker, log the Result to MLflow."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Callable

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from fxtrack import scenarios
from fxtrack.config.schema import FxtrackConfig
from fxtrack.config.validate import ConfigError, Refused, expected_device_kind, validate
from fxtrack.worker.protocol import Result
from fxtrack.orchestrator import from_run
from fxtrack.orchestrator.job import Job, job_spec
from fxtrack.orchestrator.sweep import (
    JOBS_DIR,
    SWEEP_ID_ENV,
    SWEEP_TOTAL_ENV,
    numbers_wrong,
    skipped_job,
)
from fxtrack.tracking.records import sync_advice
from fxtrack.tracking.records import run_name
from fxtrack.tracking.target import tracking_uri


def redact_hydra_files(hc, multirun: bool) -> None:
    """Hydra saved the composed config in the job's .hydra/ (and a sweep's in multirun.yaml)
    before this task ran, a preset's tracking.uri with its password included: rewritten without
    credentials before anything else (issue 60)."""
    from fxtrack.environment import redact_file

    paths = list(Path(hc.runtime.output_dir, hc.output_subdir).glob("*.yaml")
                 if hc.output_subdir else [])
    for path in paths + ([Path(hc.sweep.dir) / "multirun.yaml"] if multirun else []):
        redact_file(path)


STARTED: list[bool] = []  # the Hydra app reached its task: an error from here on is the job's


def task(cfg: DictConfig) -> None:
    """One job (or, for scenario=scaling, one job per device count), each run in its worker,
    spooled and logged; exits non-zero on failure when not part of a sweep."""
    STARTED.append(True)
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    redact_hydra_files(hc, multirun)
    try:
        if from_run.run_id(cfg):  # the run's model and data in place of the command line's
            from_run.apply(cfg, tracking_uri(cfg.tracking.uri, hc.runtime.cwd))
        conf, arch = validate(cfg, sweep=multirun)
    except Refused as e:
        if multirun:  # the sweep listed it up front: a NOT SUPPORTED cell, no worker, no run
            skip(hc, e)
            return
        print(f"fxtrack: {e.headline}, nothing was run: {e}", file=sys.stderr)
        sys.exit(2)
    except ConfigError as e:
        print(f"fxtrack: invalid config: {e}", file=sys.stderr)
        sys.exit(2)
    preflight(conf, hc.runtime.cwd, check_server=not multirun)  # a sweep checked it once
    if conf.quantize.value == "none":  # int8 runs have no MFU (orchestrator.job.enrich)
        from fxtrack.orchestrator import calibration

        calibration.preflight(conf.framework.name, conf.framework.python, conf.precision.name,
                              expected_device_kind(conf.hardware.name) or "",
                              conf.hardware.cpu_threads, scenarios.get(conf.scenario.name).mfu)
    job_dir = Path(hc.runtime.output_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    job = Job(cfg, conf, arch, hc.runtime.cwd)
    parent = os.environ.get(SWEEP_ID_ENV) if multirun else None
    if multirun:
        label = f"{conf.framework.name}-{arch.name}-{conf.scenario.name}"
        print(f"[fxtrack] job {hc.job.num + 1}/{os.environ.get(SWEEP_TOTAL_ENV, '?')}: {label}",
              file=sys.stderr, flush=True)
    # repeats=N: N workers and one aggregate run per config (fxtrack/orchestrator/repeats.py);
    # a scenario with its own driver (fit's probe search, scaling's device sweep) repeats its
    # own way
    repeating = conf.repeats > 1 and scenarios.get(conf.scenario.name).repeatable
    jobs = Path(hc.sweep.dir) / JOBS_DIR if multirun else None
    cell = None  # a sweep's repeat: (aggregate id, repeat index, resumed group or None)
    if repeating and multirun:
        from fxtrack.orchestrator import repeats

        aggregate, repeat = repeats.sweep_position(hc.job.num, parent)
        group = repeats.group_of(job, conf) if conf.resume else None
        cell = (group["aggregate"] if group else aggregate, repeat, group)
        if group and repeat in group["done"]:  # resume=true: this repeat finished before
            resumed_repeat(job, conf, jobs, hc, cell, parent)
            return
    elif conf.resume and resumed(job, conf, hc, multirun, repeating):
        return
    try:
        name, result, run_id = dispatch(job, conf, job_dir, parent, jobs, repeating, cell)()
    except Exception as e:  # noqa: BLE001 - an orchestrator bug in one cell: the sweep goes on
        if not multirun:
            raise
        # the cell's runs close themselves (fit's parent); its job file says why, for the
        # closing table
        name, run_id = f"job {hc.job.num + 1}", None
        result = Result("", status="FAILED", error=f"fxtrack failed: {type(e).__name__}: {e}")
        print(f"fxtrack: {name}: {result.error}", file=sys.stderr, flush=True)
        if job.last_record is None:  # nothing logged for the cell: a FAILED run says why
            run_id = job.log_failed(job_dir, parent, result.error)
    if multirun:
        record = job.last_record or {}
        write_job_file(hc, {
            "name": name, "status": result.status, "guard": result.guard, "error": result.error,
            "metrics": result.metrics, "run_id": run_id, "tags": record.get("tags", {}),
            "params": record.get("params", {}),
            "aggregate": cell[0] if cell else record.get("tags", {}).get("fxtrack.repeat_of"),
            # a rate search's probes: the sweep's common-rate windows (sweep.common_rate_plan)
            "probes": [[c["metrics"].get("requested_rate_rps"), c["tags"].get("serve_probe")]
                       for c in result.children]})
        if cell is not None:  # the config's last repeat closes its aggregate
            from fxtrack.orchestrator import repeats

            repeats.after_repeat(job, cell[0], parent, jobs, cell[1] == conf.repeats - 1)
        return
    from fxtrack.tracking.ui import next_steps

    print(next_steps(job.uri, run_id, experiment=conf.tracking.experiment), file=sys.stderr)
    if result.status != "FINISHED" or run_id is None:
        sys.exit(1)  # failed, or finished but only spooled: either way not in MLflow yet
    if numbers_wrong(result.guard):
        print(f"fxtrack: {name}: the correctness guard failed: {result.guard}; the figures "
              "are logged, marked fxtrack.guard", file=sys.stderr)
        sys.exit(1)


def dispatch(job: Job, conf: FxtrackConfig, job_dir: Path, parent: str | None,
             jobs: Path | None, repeating: bool, cell: tuple | None
             ) -> Callable[[], tuple[str, Result, str | None]]:
    """The cell's run as its scenario asks, to call: it returns (name, Result, run id). A
    partial, not a call, so the run's frames start right under the task. ``cell``: a sweep's
    repeat (aggregate id, repeat index, resumed group or None)."""
    driver = scenarios.get(conf.scenario.name).part("driver")
    if driver is not None:  # fit's probe search, scaling's device sweep
        return functools.partial(driver, job, job_dir, parent)
    if repeating:
        from fxtrack.orchestrator import repeats

        if cell is not None:
            return functools.partial(repeats.run_one, job, job_dir, parent, cell[0], cell[1],
                                     jobs, reopen=cell[2] is not None)
        return functools.partial(repeats.run_all, job, job_dir)
    return functools.partial(job.run, job_dir, parent, conf.devices)


def resumed_repeat(job: Job, conf: FxtrackConfig, jobs: Path, hc: HydraConfig, cell: tuple,
                   parent: str | None) -> None:
    """resume=true, a sweep's repeat its group finished before: not run again; its job file
    carries the finished run's figures, so the group's aggregate is completed from them."""
    from fxtrack.orchestrator import repeats

    aggregate, repeat, group = cell
    done = group["done"][repeat]
    print(f"[fxtrack] {done['name']}: finished before (run {done['run_id']}); skipped "
          "(resume=true)", file=sys.stderr, flush=True)
    write_job_file(hc, dict(done, error=f"finished before (run {done['run_id']}): skipped, "
                                      "resume=true", aggregate=aggregate, resumed=True))
    if repeat == conf.repeats - 1 and not repeats.complete(group, conf.repeats):
        repeats.after_repeat(job, aggregate, parent, jobs, last=True)


def resumed(job: Job, conf: FxtrackConfig, hc: HydraConfig, multirun: bool,
            repeating: bool) -> bool:
    """resume=true: True (the run or cell is skipped, saying so) when its identical config
    already has a FINISHED run in the store. A fit or scaling cell is run again: its runs are a
    search, not one run (docs/contract.md); a repeats run resumes its group (repeats.run_all)."""
    from fxtrack.orchestrator.job import config_id
    from fxtrack.tracking import reader

    if repeating:  # repeats.run_all runs only the missing repeats of its group
        return False
    if not scenarios.get(conf.scenario.name).repeatable:  # a search or a device sweep
        print("fxtrack: resume=true skips single runs and repeats only; this "
              f"{conf.scenario.name} run goes ahead", file=sys.stderr)
        return False
    config = dict(job.config, devices=conf.devices)
    run_id = reader.finished_run(job.uri, conf.tracking.experiment, config_id(config))
    if run_id is None:
        return False
    name = run_name(job_spec(conf, job.arch, Path(hc.runtime.output_dir)), conf.size.name)
    print(f"[fxtrack] {name}: finished before (run {run_id}); skipped (resume=true)",
          file=sys.stderr, flush=True)
    if multirun:
        write_job_file(hc, {
            "name": name, "status": "FINISHED", "guard": "ok", "metrics": {}, "run_id": run_id,
            "error": f"finished before (run {run_id}): skipped, resume=true", "tags": {},
            "params": {}, "aggregate": None})
    return True


def skip(hc: HydraConfig, refused: Refused) -> None:
    """A sweep's cell without a path: its job file says NOT SUPPORTED (not run, not logged)."""
    name = run_name(job_spec(refused.conf, refused.arch, Path(hc.runtime.output_dir)),
                    refused.conf.size.name)
    print(f"[fxtrack] job {hc.job.num + 1}/{os.environ.get(SWEEP_TOTAL_ENV, '?')}: {name}: "
          "not supported, skipped", file=sys.stderr, flush=True)
    write_job_file(hc, skipped_job(name, str(refused)))


def write_job_file(hc: HydraConfig, entry: dict) -> None:
    """This sweep job's line for the closing table and its aggregate (``fxtrack_jobs/NNNN.json``)."""
    jobs = Path(hc.sweep.dir) / JOBS_DIR
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / f"{hc.job.num:04d}.json").write_text(json.dumps(entry))


def preflight(conf: FxtrackConfig, launch_dir: str, check_server: bool = True) -> None:
    """Before any work: the spool must be writable, the tracking target valid (exit 2 saying
    what to fix); a server that is down only means the result will be spooled. An embedded
    sqlite store is checked without MLflow (tracking/target.py), which the job then loads while
    its worker starts (Job.run): ~2-3 s of import off every run's wall time."""
    from fxtrack.tracking import spool, target

    uri = target.tracking_uri(conf.tracking.uri, launch_dir)
    try:
        spool.check_writable()
        if not check_server:
            return
        target.check_static(uri, conf.tracking.experiment)
        if target.check_sqlite(uri, conf.tracking.experiment):
            return
        from fxtrack.tracking import writer

        writer.check_target(uri, conf.tracking.experiment)
    except (spool.SpoolError, target.TrackingRejected) as e:
        print(f"fxtrack: {e}", file=sys.stderr)
        sys.exit(2)
    except target.TrackingUnavailable as e:
        print(f"fxtrack: the tracking server is not answering ({e}); the result will be kept "
              f"in the local spool: {sync_advice(uri)}", file=sys.stderr)
