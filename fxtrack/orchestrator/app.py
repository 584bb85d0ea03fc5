"""The Hydra task: validate the config, run the job in a worker, log the Result to MLflow."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import time
import uuid
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from fxtrack import architectures
from fxtrack.config.schema import FxtrackConfig
from fxtrack.job import JobSpec, Result
from fxtrack.measure.load import is_contended
from fxtrack.orchestrator.runner import log_tail, run_worker
from fxtrack.tracking.records import NOISY_CV

SWEEP_ID_ENV, SWEEP_TOTAL_ENV = "FXTRACK_SWEEP_ID", "FXTRACK_SWEEP_TOTAL"
JOBS_DIR = "fxtrack_jobs"  # in the sweep directory: one status file per job, for the closing table


class ConfigError(ValueError):
    """A config that cannot run; reported in one line before any work starts."""


def unknown_keys(cfg: DictConfig) -> None:
    """Raise ConfigError for a key no schema defines (``+batchsize=8``: Hydra's ``+`` adds any
    key), naming the closest valid one."""
    import dataclasses
    import difflib

    from fxtrack.config import schema

    groups = {f.name: f.type for f in dataclasses.fields(FxtrackConfig)}
    nested = {g: {f.name for f in dataclasses.fields(c)} for g, c in schema._GROUP_SCHEMAS.items()}
    nested["tracking"] = {f.name for f in dataclasses.fields(schema.TrackingConfig)}
    nested["model"] = {f.name for c in schema._MODEL_SCHEMAS.values()
                       for f in dataclasses.fields(c)}
    valid = set(groups) | {f"{g}.{k}" for g, keys in nested.items() for k in keys}
    for key in cfg:
        names = [key] if key not in nested or not isinstance(cfg[key], DictConfig) else \
            [f"{key}.{k}" for k in cfg[key]]
        for name in names:
            if name not in valid:
                close = difflib.get_close_matches(name, sorted(valid), n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise ConfigError(f"unknown config key {name!r}{hint} (python -m fxtrack --help "
                                  "lists the keys)")


def validate(cfg: DictConfig) -> tuple[FxtrackConfig, architectures.Arch]:
    """Typed, value-checked config and its architecture; raises ConfigError naming the key."""
    unknown_keys(cfg)
    try:
        conf: FxtrackConfig = OmegaConf.to_object(cfg)
        arch = architectures.resolve(conf.model.name, conf.size.name,
                                     **{k: v for k, v in vars(conf.model).items() if k != "name"})
    except Exception as e:  # noqa: BLE001 - omegaconf wraps __post_init__ errors in its own types
        raise ConfigError(str(e).splitlines()[0]) from None
    if conf.scenario.runner is None:
        raise ConfigError(f"scenario={conf.scenario.name} is not implemented yet "
                          "(implemented: scenario=train)")
    module = conf.framework.backend.rpartition(".")[0]
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"framework={conf.framework.name} is not implemented yet")
    return conf, arch


def job_spec(conf: FxtrackConfig, arch: architectures.Arch, job_dir: Path) -> JobSpec:
    fw = conf.framework
    return JobSpec(
        result_id=uuid.uuid4().hex, framework=fw.name, backend=fw.backend, extra=fw.extra,
        scenario=conf.scenario.name, runner=conf.scenario.runner, arch=arch.to_json(),
        precision=conf.precision.name, hardware=conf.hardware.name, devices=conf.devices,
        compile=fw.compile != "false", compile_request=fw.compile, compile_mode=fw.compile_mode,
        seed=conf.seed, batch_size=conf.batch_size, steps=conf.steps,
        warmup_steps=conf.warmup_steps, result_path=str(job_dir / "result.json"),
        verbose=conf.verbose, progress=sys.stderr.isatty() or bool(os.environ.get("FXTRACK_PROGRESS")),
        launcher=fw.launcher, nodes=conf.hardware.nodes, node_rank=conf.hardware.node_rank,
        coordinator=conf.hardware.coordinator, cpu_threads=conf.hardware.cpu_threads,
        wait_for_idle_s=conf.hardware.wait_for_idle_s, parallel=conf.parallel.value,
        memory=conf.memory.value, runtime=conf.runtime.value, quantize=conf.quantize.value,
        options={"dataset_samples": conf.scenario.dataset_samples,
                 "loader_workers": conf.scenario.loader_workers},
    )


def task(cfg: DictConfig) -> None:
    """One job (or, for scenario=scaling, one job per device count), each run in its worker,
    spooled and logged; exits non-zero on failure when not part of a sweep."""
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        conf, arch = validate(cfg)
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
    # repeats=N: N workers and one aggregate run per config (fxtrack/orchestrator/repeats.py).
    # Not for scenario=scaling yet: a single scaling run is not repeated, and in a sweep each of
    # its N jobs is a scaling run of its own (logged, not aggregated; the report shows the latest).
    repeating = conf.repeats > 1 and conf.scenario.name != "scaling"
    if conf.scenario.name == "scaling":
        from fxtrack.orchestrator.scaling import run_scaling

        name, result, run_id = run_scaling(job, job_dir, parent)
    elif repeating:
        from fxtrack.orchestrator import repeats

        if multirun:
            aggregate, repeat = repeats.sweep_position(hc.job.num, parent)
            name, result, run_id = repeats.run_one(job, job_dir, parent, aggregate, repeat)
        else:
            name, result, run_id = repeats.run_all(job, job_dir)
    else:
        name, result, run_id = job.run(job_dir, parent, conf.devices)
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
            repeats.close(job, aggregate, parent, [
                j for j in map(json.loads, (p.read_text() for p in sorted(jobs.glob("*.json"))))
                if j.get("aggregate") == aggregate], jobs)
    elif result.status != "FINISHED" or run_id is None:
        sys.exit(1)  # failed, or finished but only spooled: either way not in MLflow yet


def preflight(conf: FxtrackConfig, launch_dir: str, check_server: bool = True) -> None:
    """Before any work: the spool must be writable, the tracking target valid (exit 2 saying
    what to fix); a server that is down only means the result will be spooled."""
    from fxtrack.tracking import spool, writer

    try:
        spool.check_writable()
        if check_server:
            writer.check_target(writer.tracking_uri(conf.tracking.uri, launch_dir),
                                conf.tracking.experiment)
    except (spool.SpoolError, writer.TrackingRejected) as e:
        print(f"fxtrack: {e}", file=sys.stderr)
        sys.exit(2)
    except writer.TrackingUnavailable as e:
        print(f"fxtrack: the tracking server is not answering ({e}); the result will be kept "
              "in the local spool", file=sys.stderr)


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
    from fxtrack.tracking import callbacks

    callbacks.close_interrupted("KILLED")
    print(f"fxtrack: interrupted by signal {sig}; the run was recorded as KILLED",
          file=sys.stderr, flush=True)
    sys.exit(128 + sig)


class Job:
    """One composed config, ready to run as a worker (at any device count) and be logged."""

    def __init__(self, cfg: DictConfig, conf: FxtrackConfig, arch: architectures.Arch,
                 launch_dir: str) -> None:
        from fxtrack.tracking import records, writer

        self.cfg, self.conf, self.arch = cfg, conf, arch
        if not conf.verbose:  # MLflow's database-migration chatter is noise to a user
            for name in ("mlflow", "alembic"):
                logging.getLogger(name).setLevel(logging.WARNING)
        self.uri = writer.tracking_uri(conf.tracking.uri, launch_dir)
        config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
        config["tracking"]["uri"] = records.redact_uri(config["tracking"]["uri"] or "") or None
        self.config = config  # what is logged: resolved, without credentials
        self.last_record: dict | None = None  # the latest run's record (tags, params), for repeats

    def run(self, job_dir: Path, parent: str | None, devices: int,
            scenario: str | None = None, repeat: int | None = None) -> tuple[str, Result, str | None]:
        """Run the worker at ``devices``, enrich, log; returns (run name, Result, run id).
        ``repeat``: which of ``repeats`` this run is (its parent is then the config's aggregate)."""
        from fxtrack.tracking import records

        spec = job_spec(self.conf, self.arch, job_dir)
        spec.devices = devices
        spec.scenario = scenario or spec.scenario
        if repeat is not None:
            spec.repeat = repeat
        name = records.display_name(spec)
        start_ms = int(time.time() * 1000)
        result = run_worker(spec, job_dir, self.conf.framework.python, self.conf.timeout_s)
        if spec.node_rank != 0:  # only node 0 talks to MLflow; its Result covers every node
            print(f"{name}: node {spec.node_rank} {result.status.lower()}"
                  + (f": {result.error}" if result.error else ""), file=sys.stderr, flush=True)
            return name, result, "node"
        if result.status == "FINISHED":
            enrich(result, spec, self.conf)
        if repeat is not None:  # -> fxtrack.repeat, fxtrack.repeat_of (the report skips these)
            result.tags.update(repeat=str(repeat), repeat_of=parent or "")
        result.dump(Path(spec.result_path))  # the final word, timeouts and signals included
        config = dict(self.config, devices=devices)
        self.last_record = record = records.job_record(
            spec, result, config, self.uri, self.conf.tracking.experiment, parent, start_ms)
        run_id, where = self.log(record, {
                "config.yaml": OmegaConf.to_yaml(OmegaConf.create(config)),
                "result.json": Path(spec.result_path),
                "environment.json": records.environment_json(),
                "worker.log": log_tail(job_dir / "worker.log")})
        print(f"{summary_line(name, result)}  [{where}]", file=sys.stderr, flush=True)
        stop_if_interrupted()
        return name, result, run_id

    def log(self, record: dict, artifacts: dict) -> tuple[str | None, str]:
        """Spool ``record``, deliver it; (run id or None, where it went)."""
        from fxtrack.tracking import spool, writer

        entry = spool.write(record, artifacts)
        try:
            run_id = writer.deliver(entry, self.uri)
        except writer.TrackingRejected as e:
            print(f"fxtrack: {record['uri']} refused the run: {e}\n"
                  f"fxtrack: the result is kept in {entry}; fix that, then run `fxtrack sync`",
                  file=sys.stderr)
            return None, "spooled"
        except writer.TrackingUnavailable as e:
            print(f"fxtrack: could not log to {record['uri']}: {e}\n"
                  f"fxtrack: the result is kept in {entry}; run `fxtrack sync` when the server "
                  "is back", file=sys.stderr)
            return None, "spooled"
        return run_id, f"mlflow run {run_id}"


def enrich(result: Result, spec: JobSpec, conf: FxtrackConfig) -> None:
    """Figures the orchestrator adds: MFU against the one peak per device and precision, the
    code complexity of this framework's implementation, and the cost per 1M samples (tokens)."""
    from fxtrack.measure import complexity, cost, peak

    m = result.metrics
    m.update(complexity.code_metrics(spec.framework))
    m.update(cost.cost_metrics(conf.hardware.price_per_hour, spec.devices, spec.nodes, m))
    if "achieved_tflops" not in m:  # e.g. checkpoint: no timed compute, no MFU
        return
    if spec.quantize != "none":  # int8 matmuls against the float peak: no meaningful MFU (a
        return  # dynamic_int8 BERT on CPU read 185%); achieved_tflops stays, for the record
    device = result.tags.get("device", result.resolved.get("device_kind", "cpu"))
    hardware = result.resolved.get("device_kind", spec.hardware)
    mfu, tags = peak.mfu_metrics(spec.framework, device, spec.precision, hardware,
                                 spec.devices * spec.nodes, m["achieved_tflops"],
                                 {spec.framework: conf.framework.python}, spec.cpu_threads)
    m.update(mfu)
    result.tags.update(tags)  # peak_tflops_source, peak_calibrated, mfu_over_1


# Headline figures for the one-line summary, in order, where a scenario logged them.
_HEADLINE = [("throughput_samples_per_s", "{:.1f} samples/s"), ("step_time_ms_p50", "step p50 {:.1f} ms"),
             ("compile_time_s", "compile {:.1f} s"), ("pipeline_samples_per_s", "loader {:.1f} samples/s"),
             ("input_bound_fraction", "input-bound {:.0%}"), ("checkpoint_save_s", "save {:.2f} s"),
             ("checkpoint_restore_s", "restore {:.2f} s"), ("checkpoint_mib", "checkpoint {:.0f} MiB"),
             ("export_s", "export {:.2f} s"), ("peak_mem_device_mib", "device peak {:.0f} MiB"),
             ("peak_rss_mib", "RSS peak {:.0f} MiB"), ("mfu", "MFU {:.1%}")]


def summary_line(name: str, result: Result) -> str:
    """One line per run: status and the headline figures its scenario logged."""
    if result.status != "FINISHED":
        return f"{name}: {result.status}: {result.error}"
    m = result.metrics
    parts = [fmt.format(m[key]) for key, fmt in _HEADLINE if key in m]
    notes = "" if result.guard == "ok" else f"  WARNING: correctness guard: {result.guard}"
    if m.get("mfu", 0.0) > 1.0:  # impossible: the peak or the FLOP count is wrong
        notes += (f"  WARNING: MFU {m['mfu']:.0%} > 100%: peak {m.get('peak_tflops', 0):.1f} "
                  f"TFLOP/s ({result.tags.get('peak_tflops_source', '?')}) is below this run's rate")
    if m.get("step_time_cv", 0.0) > NOISY_CV:
        notes += f"  NOTE: noisy: step times vary {m['step_time_cv']:.0%} (CV > {NOISY_CV:.0%})"
    if is_contended(m.get("host_other_cpu_frac")):
        notes += (f"  CONTENDED: other processes took {m['host_other_cpu_frac']:.0%} of the "
                  "cores during the timed window")
    return f"{name}: " + ", ".join(parts) + notes
