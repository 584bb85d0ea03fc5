"""The Hydra task: validate the config, run the job in a worker, log the Result to MLflow."""

from __future__ import annotations

import importlib.util
import json
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
from fxtrack.orchestrator.runner import log_tail, run_worker
from fxtrack.tracking.records import NOISY_CV

SWEEP_ID_ENV, SWEEP_TOTAL_ENV = "FXTRACK_SWEEP_ID", "FXTRACK_SWEEP_TOTAL"
JOBS_DIR = "fxtrack_jobs"  # in the sweep directory: one status file per job, for the closing table


class ConfigError(ValueError):
    """A config that cannot run; reported in one line before any work starts."""


def validate(cfg: DictConfig) -> tuple[FxtrackConfig, architectures.Arch]:
    """Typed, value-checked config and its architecture; raises ConfigError naming the key."""
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
        compile=fw.compile, seed=conf.seed, batch_size=conf.batch_size, steps=conf.steps,
        warmup_steps=conf.warmup_steps, result_path=str(job_dir / "result.json"),
        verbose=conf.verbose, progress=sys.stderr.isatty() or bool(os.environ.get("FXTRACK_PROGRESS")),
    )


def task(cfg: DictConfig) -> None:
    """One job: run in its worker, spooled, logged; exits non-zero on failure (single run)."""
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        conf, arch = validate(cfg)
    except ConfigError as e:
        print(f"fxtrack: invalid config: {e}", file=sys.stderr)
        sys.exit(2)
    job_dir = Path(hc.runtime.output_dir)
    job_dir.mkdir(parents=True, exist_ok=True)
    spec = job_spec(conf, arch, job_dir)
    from fxtrack.tracking import records  # no mlflow import here

    name = records.run_name(spec)
    if multirun:
        total = os.environ.get(SWEEP_TOTAL_ENV, "?")
        print(f"[fxtrack] job {hc.job.num + 1}/{total}: {name}", file=sys.stderr, flush=True)
    start_ms = int(time.time() * 1000)
    result = run_worker(spec, job_dir, conf.framework.python, conf.timeout_s, echo=True)
    if result.status == "FINISHED":
        enrich(result, spec, conf)
    result.dump(Path(spec.result_path))  # the final word, timeouts and signals included

    line = summary_line(name, result)
    run_id, where = _log(cfg, conf, spec, result, start_ms, hc.runtime.cwd,
                         os.environ.get(SWEEP_ID_ENV) if multirun else None, job_dir)
    print(f"{line}  [{where}]", file=sys.stderr, flush=True)
    if multirun:
        jobs = Path(hc.sweep.dir) / JOBS_DIR
        jobs.mkdir(parents=True, exist_ok=True)
        (jobs / f"{hc.job.num:04d}.json").write_text(json.dumps(
            {"name": name, "status": result.status, "guard": result.guard, "error": result.error,
             "metrics": result.metrics, "run_id": run_id}))
    elif result.status != "FINISHED" or run_id is None:
        sys.exit(1)  # failed, or finished but only spooled: either way not in MLflow yet


def enrich(result: Result, spec: JobSpec, conf: FxtrackConfig) -> None:
    """Figures the orchestrator adds: MFU against the one peak per device and precision, and
    the code complexity of this framework's implementation."""
    from fxtrack.measure import complexity, peak

    m = result.metrics
    device = result.tags.get("device", result.resolved.get("device_kind", "cpu"))
    hardware = result.resolved.get("device_kind", spec.hardware)
    mfu, source = peak.mfu_metrics(spec.framework, device, spec.precision, hardware, spec.devices,
                                   m.get("achieved_tflops", 0.0),
                                   {spec.framework: conf.framework.python})
    m.update(mfu)
    if source:
        result.tags["peak_tflops_source"] = source
    m.update(complexity.code_metrics(spec.framework))


def _log(cfg, conf, spec, result, start_ms, launch_dir, parent, job_dir) -> tuple[str | None, str]:
    from fxtrack.tracking import records, spool, writer

    uri = writer.tracking_uri(conf.tracking.uri, launch_dir)
    config = OmegaConf.to_container(cfg, resolve=True)
    config["tracking"]["uri"] = records.redact_uri(config["tracking"]["uri"] or "") or None
    record = records.job_record(spec, result, config, uri, conf.tracking.experiment, parent,
                                start_ms)
    entry = spool.write(record, {
        "config.yaml": OmegaConf.to_yaml(OmegaConf.create(config)),
        "result.json": Path(spec.result_path),
        "environment.json": records.environment_json(),
        "worker.log": log_tail(job_dir / "worker.log"),
    })
    try:
        run_id = writer.deliver(entry, uri)
    except writer.TrackingUnavailable as e:
        print(f"fxtrack: could not log to {records.redact_uri(uri)}: {e}\n"
              f"fxtrack: the result is kept in {entry}; run `fxtrack sync` when the server is back",
              file=sys.stderr)
        return None, "spooled"
    return run_id, f"mlflow run {run_id}"


def summary_line(name: str, result: Result) -> str:
    """One line per run: status and headline figures."""
    if result.status != "FINISHED":
        return f"{name}: FAILED: {result.error}"
    m = result.metrics
    parts = [f"{m['throughput_samples_per_s']:.1f} samples/s",
             f"step p50 {m['step_time_ms_p50']:.1f} ms",
             f"compile {m['compile_time_s']:.1f} s"]
    if "peak_mem_device_mib" in m:
        parts.append(f"device peak {m['peak_mem_device_mib']:.0f} MiB")
    parts.append(f"RSS peak {m['peak_rss_mib']:.0f} MiB")
    if "mfu" in m:
        parts.append(f"MFU {m['mfu']:.1%}")
    notes = "" if result.guard == "ok" else f"  WARNING: correctness guard: {result.guard}"
    if m.get("step_time_cv", 0.0) > NOISY_CV:
        notes += f"  NOTE: noisy: step times vary {m['step_time_cv']:.0%} (CV > {NOISY_CV:.0%})"
    return f"{name}: " + ", ".join(parts) + notes
