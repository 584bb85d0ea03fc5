"""``scenario=scaling``: one parent run, one child per device count (1, 2, 4, ... and
``devices``) at a fixed per-device batch; the parent logs how throughput scales."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Optional

from fxtrack.worker.protocol import Result


def device_counts(devices: int) -> list[int]:
    """1, 2, 4, ... below ``devices``, then ``devices`` itself."""
    counts, n = [], 1
    while n < devices:
        counts.append(n)
        n *= 2
    return counts + [devices]


def scaling_metrics(throughput: dict[int, float]) -> dict[str, float]:
    """``speedup_x{N}`` = T(N) / T(1); ``scaling_efficiency_x{N}`` = T(N) / (N T(1));
    ``scaling_efficiency`` at the largest N measured."""
    if 1 not in throughput:
        return {}
    base, metrics = throughput[1], {}
    for n, t in sorted(throughput.items()):
        metrics[f"speedup_x{n}"] = t / base
        metrics[f"scaling_efficiency_x{n}"] = t / (n * base)
    metrics["scaling_efficiency"] = metrics[f"scaling_efficiency_x{max(throughput)}"]
    return metrics


def measured_metrics(throughput: dict[int, float]) -> dict[str, float]:
    """The parent's figures from the device counts measured so far."""
    metrics = scaling_metrics(throughput)
    metrics.update({f"throughput_samples_per_s_x{n}": t for n, t in throughput.items()})
    return metrics


def run(job, job_dir: Path, parent: Optional[str]) -> tuple[str, Result, Optional[str]]:
    """Run every device count as a child of one scaling parent; returns the parent's outcome."""
    from fxtrack.orchestrator.job import job_spec
    from fxtrack.tracking import records

    conf, devices = job.conf, job.conf.devices
    spec = job_spec(conf, job.arch, job_dir)
    spec.scenario, spec.devices = "scaling", devices
    name = records.run_name(spec, conf.size.name)
    scaling_id = uuid.uuid4().hex
    tags = {"fxtrack.framework": conf.framework.name, "fxtrack.model": job.arch.name,
            "fxtrack.scenario": "scaling", "fxtrack.precision": conf.precision.name,
            "fxtrack.devices": str(devices), "fxtrack.hardware": conf.hardware.name}

    def log_parent(status: str, metrics: dict[str, float]) -> Optional[str]:
        record = records.parent_record(scaling_id, job.uri, conf.tracking.experiment, name, tags,
                                       status, parent, metrics)
        return job.tracker.log(record, {})[0]

    log_parent("RUNNING", {})
    outcome = Result(scaling_id, status="FINISHED")
    throughput: dict[int, float] = {}
    try:
        for n in device_counts(devices):  # each child is logged by job.run as it ends
            child_dir = job_dir / f"x{n}"
            child_dir.mkdir(parents=True, exist_ok=True)
            _, result, _ = job.run(child_dir, scaling_id, n, scenario="scaling")
            if result.status == "FINISHED":
                throughput[n] = result.metrics["throughput_samples_per_s"]
                outcome.tags.update(result.tags)
            else:
                outcome.status, outcome.error = "FAILED", f"x{n}: {result.error}"
    except Exception as e:  # noqa: BLE001 - this process's own error: the parent closes FAILED
        # with the device counts measured, not RUNNING until a sync (issue 43)
        outcome.status, outcome.error = "FAILED", f"the scaling run failed: {type(e).__name__}: {e}"
    except (KeyboardInterrupt, SystemExit):  # a signal stopped a child (its run is KILLED):
        # close this parent too, with what was measured, before the sweep exits
        tags.update({"fxtrack.status": "failed", "fxtrack.error": "interrupted"})
        log_parent("KILLED", measured_metrics(throughput))
        raise
    outcome.metrics = measured_metrics(throughput)
    if devices in throughput:
        outcome.metrics["throughput_samples_per_s"] = throughput[devices]
    if outcome.status == "FINISHED" and outcome.metrics:
        tags["fxtrack.status"] = "ok"
    else:
        tags["fxtrack.status"] = "failed"
        if outcome.error:
            tags["fxtrack.error"] = outcome.error
    efficiency = outcome.metrics.get("scaling_efficiency")
    line = (f"{name}: scaling efficiency at x{devices}: "
            f"{'-' if efficiency is None else f'{efficiency:.0%}'}")
    tags.update(records.note(line))
    run_id = log_parent(outcome.status, outcome.metrics)
    print(line, flush=True)
    return name, outcome, run_id
