"""The Hydra task: validate the config, run the job in a worker, log the Result to MLflow."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from fxtrack import scenarios
from fxtrack.config.schema import FxtrackConfig
from fxtrack.config.validate import ConfigError, Refused, validate
from fxtrack.job import Result
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


def task(cfg: DictConfig) -> None:
    """One job (or, for scenario=scaling, one job per device count), each run in its worker,
    spooled and logged; exits non-zero on failure when not part of a sweep."""
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
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
    if conf.resume and resumed(job, conf, hc, multirun, repeating):
        return
    try:
        name, result, run_id, repeat, aggregate = dispatch(job, conf, job_dir, parent, hc,
                                                          multirun, repeating)
    except Exception as e:  # noqa: BLE001 - an orchestrator bug in one cell: the sweep goes on
        if not multirun:
            raise
        # the cell's runs close themselves (fit's parent); its job file says why, for the
        # closing table
        name, run_id, repeat, aggregate = f"job {hc.job.num + 1}", None, None, None
        result = Result("", status="FAILED", error=f"fxtrack failed: {type(e).__name__}: {e}")
        print(f"fxtrack: {name}: {result.error}", file=sys.stderr, flush=True)
        if job.last_record is None:  # nothing logged for the cell: a FAILED run says why
            run_id = job.log_failed(job_dir, parent, result.error)
    if multirun:
        jobs = Path(hc.sweep.dir) / JOBS_DIR
        jobs.mkdir(parents=True, exist_ok=True)
        record = job.last_record or {}
        (jobs / f"{hc.job.num:04d}.json").write_text(json.dumps(
            {"name": name, "status": result.status, "guard": result.guard, "error": result.error,
             "metrics": result.metrics, "run_id": run_id, "tags": record.get("tags", {}),
             "params": record.get("params", {}),
             "aggregate": record.get("tags", {}).get("fxtrack.repeat_of")}))
        if repeating and repeat == conf.repeats - 1:  # the config's last repeat: close its aggregate
            from fxtrack.orchestrator import repeats

            repeats.close(job, aggregate, parent, [
                j for j in map(json.loads, (p.read_text() for p in sorted(jobs.glob("*.json"))))
                if j.get("aggregate") == aggregate], jobs)
        return
    from fxtrack.tracking.ui import next_steps

    print(next_steps(job.uri, run_id, experiment=conf.tracking.experiment), file=sys.stderr)
    if result.status != "FINISHED" or run_id is None:
        sys.exit(1)  # failed, or finished but only spooled: either way not in MLflow yet
    if numbers_wrong(result.guard):
        print(f"fxtrack: {name}: the correctness guard failed: {result.guard}; the figures "
              "are logged, marked fxtrack.guard", file=sys.stderr)
        sys.exit(1)


def dispatch(job: Job, conf: FxtrackConfig, job_dir: Path, parent: str | None, hc: HydraConfig,
             multirun: bool, repeating: bool):
    """Run the cell as its scenario asks; (name, Result, run id, repeat, aggregate)."""
    repeat = aggregate = None
    driver = scenarios.get(conf.scenario.name).driver
    if driver is not None:  # fit's probe search, scaling's device sweep
        from fxtrack.frameworks.declaration import import_path

        name, result, run_id = import_path(driver)(job, job_dir, parent)
    elif repeating:
        from fxtrack.orchestrator import repeats

        if multirun:
            aggregate, repeat = repeats.sweep_position(hc.job.num, parent)
            name, result, run_id = repeats.run_one(job, job_dir, parent, aggregate, repeat)
        else:
            name, result, run_id = repeats.run_all(job, job_dir)
    else:
        name, result, run_id = job.run(job_dir, parent, conf.devices)
    return name, result, run_id, repeat, aggregate


def resumed(job: Job, conf: FxtrackConfig, hc: HydraConfig, multirun: bool,
            repeating: bool) -> bool:
    """resume=true: True (the run or cell is skipped, saying so) when its identical config
    already has a FINISHED run in the store. A fit, scaling or repeats cell is run again: its
    runs are a search or a set, not one run (docs/contract.md)."""
    from fxtrack.orchestrator.job import config_id
    from fxtrack.tracking import reader

    if repeating or not scenarios.get(conf.scenario.name).repeatable:  # a search or a sweep
        print("fxtrack: resume=true skips single runs only; this "
              f"{'repeats' if repeating else conf.scenario.name} run goes ahead", file=sys.stderr)
        return False
    config = dict(job.config, devices=conf.devices)
    run_id = reader.finished_run(job.uri, conf.tracking.experiment, config_id(config))
    if run_id is None:
        return False
    name = run_name(job_spec(conf, job.arch, Path(hc.runtime.output_dir)), conf.size.name)
    print(f"[fxtrack] {name}: finished before (run {run_id}); skipped (resume=true)",
          file=sys.stderr, flush=True)
    if multirun:
        jobs = Path(hc.sweep.dir) / JOBS_DIR
        jobs.mkdir(parents=True, exist_ok=True)
        (jobs / f"{hc.job.num:04d}.json").write_text(json.dumps(
            {"name": name, "status": "FINISHED", "guard": "ok", "metrics": {}, "run_id": run_id,
             "error": f"finished before (run {run_id}): skipped, resume=true", "tags": {},
             "params": {}, "aggregate": None}))
    return True


def skip(hc: HydraConfig, refused: Refused) -> None:
    """A sweep's cell without a path: its job file says NOT SUPPORTED (not run, not logged)."""
    name = run_name(job_spec(refused.conf, refused.arch, Path(hc.runtime.output_dir)),
                    refused.conf.size.name)
    print(f"[fxtrack] job {hc.job.num + 1}/{os.environ.get(SWEEP_TOTAL_ENV, '?')}: {name}: "
          "not supported, skipped", file=sys.stderr, flush=True)
    jobs = Path(hc.sweep.dir) / JOBS_DIR
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / f"{hc.job.num:04d}.json").write_text(json.dumps(skipped_job(name, str(refused))))


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
