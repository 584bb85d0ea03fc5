"""``repeats=N``: each config run N times, round-robin across a sweep, and one aggregate per config.

Order. Hydra's BasicSweeper launches the cartesian product of the sweep's overrides with the
first override outermost (``itertools.product``), and puts its own ``hydra.sweeper.params`` before
the command line's. conf/config.yaml declares one such param, ``FXTRACK_REPEAT=range(0, repeats)``
(set in each job's environment through ``hydra.job.env_set``), so the sweep runs every config once,
then every config again (A, B, C, A, B, C, ...): drift in the machine (another job starting,
thermal throttling) hits every config equally instead of all of one framework's repeats. Job
``k`` of a sweep with ``C`` configs is config ``k % C``, repeat ``k // C``.

Runs. Each repeat is an MLflow child run tagged ``fxtrack.repeat=i`` and ``fxtrack.repeat_of``;
its parent is the config's aggregate run (itself a child of the sweep's parent run, if any),
created when the first repeat starts and closed after the last with the median of every figure
the repeats share and the 95% interval of throughput and step time (fxtrack/stats.py says which
interval and why). ``fxtrack report`` ranks the aggregate, not the repeats.
"""

from __future__ import annotations

import json
import math
import os
import sys
import uuid
from pathlib import Path
from typing import Any, Optional

from fxtrack import stats
from fxtrack.metrics import CAVEATS
from fxtrack.orchestrator.sweep import AGGREGATES_DIR, CLOSERS, SWEEP_CONFIGS_ENV

# Identity tags an aggregate copies from its repeats, so the report groups it like a single run.
IDENTITY = ("fxtrack.framework", "fxtrack.model", "fxtrack.scenario", "fxtrack.precision",
            "fxtrack.hardware", "fxtrack.devices", "fxtrack.framework_version", "fxtrack.device",
            "fxtrack.worker_python", "fxtrack.cuda", "fxtrack.cudnn", "fxtrack.driver",
            "fxtrack.matmul_precision", "fxtrack.compile_mode", "fxtrack.attention",
            "fxtrack.cpu_threads")


# A repeat's own tags, never its aggregate's: which repeat, which group, which record, its
# config's resume key (an aggregate is not a finished cell to skip)
PER_RUN = {"fxtrack.repeat", "fxtrack.repeat_of", "fxtrack.result_id", "fxtrack.writer",
           "fxtrack.config_id"}
REPEAT_ENV = "FXTRACK_REPEAT"  # set per job by the hidden sweep dimension (conf/config.yaml)


def position(job_num: int, configs: int) -> tuple[int, int]:
    """(config index, repeat index) of sweep job ``job_num`` among ``configs`` distinct configs."""
    return job_num % configs, job_num // configs


def aggregate_id(parent_id: str, config_index: int) -> str:
    """The aggregate's result id: derived, so every repeat's task names the same parent."""
    return f"{parent_id}-config{config_index:03d}"


def aggregate_metrics(repeats: list[dict[str, float]]) -> dict[str, float]:
    """Median of every metric all the finished repeats logged, plus the intervals.

    ``throughput_ci_low|high`` and ``step_time_ms_p50_ci_low|high``: Student-t 95% intervals of
    the mean log, exponentiated (stats.log_t_interval);
    ``throughput_rel_ci`` = interval width / median; ``throughput_log_mean|sd``: mean and sample
    sd of log throughput, from which the report builds Welch intervals for ratios between
    frameworks; ``repeats``: how many repeats the figures stand on.
    """
    if not repeats:
        return {}
    shared = set.intersection(*(set(m) for m in repeats))
    out = {k: stats.median([m[k] for m in repeats]) for k in sorted(shared)}
    out["repeats"] = float(len(repeats))
    if "host_other_cpu_frac" in shared:  # the worst repeat, not the typical one, flags a config
        out["host_other_cpu_frac"] = max(m["host_other_cpu_frac"] for m in repeats)
    thr = [m["throughput_samples_per_s"] for m in repeats if m.get("throughput_samples_per_s")]
    if len(thr) == len(repeats):
        ci = stats.log_t_interval(thr)
        out.update(throughput_samples_per_s=ci.point, throughput_ci_low=ci.low,
                   throughput_ci_high=ci.high, throughput_rel_ci=ci.rel_width)
        mean, sd, _ = stats.log_summary(thr)
        out.update(throughput_log_mean=mean, throughput_log_sd=sd)
    if "step_time_ms_p50" in shared:
        ci = stats.log_t_interval([m["step_time_ms_p50"] for m in repeats])
        out.update(step_time_ms_p50_ci_low=ci.low, step_time_ms_p50_ci_high=ci.high)
    return {k: v for k, v in out.items() if math.isfinite(v)}


def aggregate_tags(jobs: list[dict[str, Any]], total: int) -> dict[str, str]:
    """Tags of a config's aggregate from its repeats' job files (``tags``, ``status``)."""
    done = [j for j in jobs if j["status"] == "FINISHED"]
    first = (done or jobs)[0].get("tags", {}) if jobs else {}
    tags = {k: first[k] for k in IDENTITY if k in first}
    # and every other fxtrack tag all its finished repeats share (the data's digest, a tag a
    # later scenario adds): an identity tag is carried without anyone listing it here
    tags.update({k: v for k, v in first.items() if k.startswith("fxtrack.")
                 and k not in PER_RUN and done
                 and all(j.get("tags", {}).get(k) == v for j in done)})
    contended = sum(j.get("tags", {}).get("fxtrack.contended") == "true" for j in done)
    guard = [j.get("guard", "ok") for j in done if j.get("guard", "ok") != "ok"]
    tags.update({"fxtrack.kind": "aggregate", "fxtrack.repeats": str(len(done)),
                 "fxtrack.repeats_requested": str(total),
                 "fxtrack.status": "failed" if not done else ("guard_failed" if guard else "ok"),
                 "fxtrack.contended": "true" if contended else "false"})
    if contended:
        tags["fxtrack.contended_repeats"] = str(contended)
    for caveat in CAVEATS:  # a caveat on any repeat qualifies the aggregate's figures too
        if caveat.tag != "contended" and any(j.get("tags", {}).get(f"fxtrack.{caveat.tag}")
                                             == "true" for j in done):
            tags[f"fxtrack.{caveat.tag}"] = "true"
    if guard:
        tags["fxtrack.guard"] = guard[0]
    return tags


def summary(name: str, metrics: dict[str, float], tags: dict[str, str]) -> str:
    """The aggregate's line: ``torch-vit-train-fp32-x1: 3 repeats, 812.4 samples/s [790.1, 834.7]``."""
    n = tags.get("fxtrack.repeats", "0")
    if "throughput_samples_per_s" not in metrics:
        return f"{name}: {n} of {tags.get('fxtrack.repeats_requested', '?')} repeats finished"
    line = (f"{name}: median of {n} repeats {metrics['throughput_samples_per_s']:.1f} samples/s "
            f"[{metrics.get('throughput_ci_low', float('nan')):.1f}, "
            f"{metrics.get('throughput_ci_high', float('nan')):.1f}] (95% interval)")
    if tags.get("fxtrack.contended") == "true":
        line += f"  CONTENDED: {tags.get('fxtrack.contended_repeats')} of {n} repeats"
    return line


# --- running the repeats (called from fxtrack.orchestrator.app.task) ---

class _Open:
    """An aggregate this process opened and has not closed: what closing it needs."""

    def __init__(self, job, parent: Optional[str], jobs_dir, entries) -> None:
        self.job, self.parent, self.jobs_dir, self.entries = job, parent, jobs_dir, entries


_OPEN: dict[str, _Open] = {}
_CLOSED: set[str] = set()  # closed by this process: a second close (a signal's, then the
# caller's own handler) must not log it again


def sweep_position(job_num: int, sweep_id: Optional[str]) -> tuple[str, int]:
    """(aggregate id, repeat index) of sweep job ``job_num``."""
    configs = int(os.environ.get(SWEEP_CONFIGS_ENV, "1"))
    index, repeat = position(job_num, configs)
    return aggregate_id(sweep_id or "sweep", index), int(os.environ.get(REPEAT_ENV, repeat))


def _name_and_tags(job, job_dir) -> tuple[str, dict[str, str]]:
    from fxtrack.orchestrator.job import job_spec
    from fxtrack.tracking import records

    spec = job_spec(job.conf, job.arch, job_dir)
    tags = {"fxtrack.framework": spec.framework, "fxtrack.model": spec.arch["name"],
            "fxtrack.scenario": spec.scenario, "fxtrack.precision": spec.precision,
            "fxtrack.devices": str(spec.devices), "fxtrack.hardware": spec.hardware,
            "fxtrack.kind": "aggregate", "fxtrack.repeats_requested": str(job.conf.repeats)}
    # never a separate run's name: the aggregate says it pools N repeats
    return f"{records.run_name(spec, job.conf.size.name)}-repeats{job.conf.repeats}", tags


def _open(job, job_dir, aggregate: str, parent: Optional[str], jobs_dir, entries) -> None:
    """Create (or, resumed, reopen) the config's aggregate run RUNNING so that its repeats can
    link to it; its held fallback closes it FAILED if this process is killed outright."""
    from fxtrack.tracking import records

    name, tags = _name_and_tags(job, job_dir)
    job.tracker.log(records.parent_record(aggregate, job.uri, job.conf.tracking.experiment, name,
                                          tags, "RUNNING", parent), {})
    _OPEN[aggregate] = _Open(job, parent, jobs_dir, entries)


def _keep(job, aggregate: str, entries: list[dict[str, Any]]) -> None:
    """After each repeat: the aggregate's held fallback carries the finished repeats' figures,
    so a kill before the close still leaves them on the aggregate (FAILED, its repeats kept)."""
    from fxtrack.tracking import records

    done = [e for e in entries if e["status"] == "FINISHED"]
    if not done or aggregate not in _OPEN:
        return
    name, tags = _name_and_tags(job, Path("."))
    tags.update(aggregate_tags(entries, job.conf.repeats))
    record = records.parent_record(aggregate, job.uri, job.conf.tracking.experiment, name, tags,
                                   "RUNNING", _OPEN[aggregate].parent,
                                   aggregate_metrics([e["metrics"] for e in done]))
    record["params"] = done[0].get("params", {})
    job.tracker.hold_parent(record)


def group_of(job, conf) -> Optional[dict[str, Any]]:
    """resume=true: the config's latest repeat group in the store (tracking.reader.repeat_group);
    None where it has none."""
    from fxtrack.orchestrator.job import config_id
    from fxtrack.tracking import reader

    return reader.repeat_group(job.uri, conf.tracking.experiment,
                               config_id(dict(job.config, devices=conf.devices)))


def complete(group: Optional[dict[str, Any]], total: int) -> bool:
    """A group whose every repeat finished and whose aggregate closed FINISHED."""
    return group is not None and group["status"] == "FINISHED" and \
        all(i in group["done"] for i in range(total))


def job_files(jobs_dir, aggregate: str) -> list[dict[str, Any]]:
    """A sweep's job files of ``aggregate``'s repeats, in job order."""
    return [j for j in map(json.loads, (p.read_text() for p in sorted(Path(jobs_dir).glob(
        "*.json")))) if j.get("aggregate") == aggregate]


def run_one(job, job_dir, sweep_id: Optional[str], aggregate: str, repeat: int, jobs_dir,
            reopen: bool = False):
    """One repeat of a sweep's config; the first one (or, resumed, the first this process runs)
    opens the config's aggregate run."""
    if (repeat == 0 or reopen) and aggregate not in _OPEN:
        _open(job, job_dir, aggregate, sweep_id, jobs_dir, lambda: job_files(jobs_dir, aggregate))
    return job.run(job_dir, aggregate, job.conf.devices, repeat=repeat)


def after_repeat(job, aggregate: str, parent: Optional[str], jobs_dir, last: bool) -> None:
    """A sweep's repeat has its job file: the config's last closes the aggregate, the others
    update its fallback."""
    entries = job_files(jobs_dir, aggregate)
    if last:
        close(job, aggregate, parent, entries, jobs_dir)
    else:
        _keep(job, aggregate, entries)


def run_all(job, job_dir):
    """A single (non-sweep) run with ``repeats=N``: N workers in a row, then the aggregate;
    with resume=true only the repeats its latest group has not finished. Returns the first
    failed repeat's (name, Result, run id), else the last one's."""
    from fxtrack.worker.protocol import Result

    group = group_of(job, job.conf) if job.conf.resume else None
    if complete(group, job.conf.repeats):
        print(f"[fxtrack] every repeat finished before (aggregate {group['aggregate']}); "
              "skipped (resume=true)", file=sys.stderr, flush=True)
        done = group["done"][job.conf.repeats - 1]
        return done["name"], Result("", status="FINISHED", metrics=done["metrics"]), \
            done["run_id"]
    aggregate = group["aggregate"] if group else aggregate_id(uuid.uuid4().hex, 0)
    entries: list[dict[str, Any]] = []
    _open(job, job_dir, aggregate, None, None, lambda: entries)
    outcome = None
    try:
        for i in range(job.conf.repeats):  # each repeat is logged by job.run as it ends
            if group and i in group["done"]:
                entries.append(group["done"][i])
                print(f"[fxtrack] {group['done'][i]['name']}: finished before; kept "
                      "(resume=true)", file=sys.stderr, flush=True)
                continue
            (job_dir / f"repeat{i}").mkdir(parents=True, exist_ok=True)
            name, result, run_id = job.run(job_dir / f"repeat{i}", aggregate, job.conf.devices,
                                           repeat=i)
            record = job.last_record or {}
            entries.append({"name": name, "status": result.status, "guard": result.guard,
                            "metrics": result.metrics, "tags": record.get("tags", {}),
                            "params": record.get("params", {})})
            _keep(job, aggregate, entries)
            if outcome is None or outcome[1].status == "FINISHED":
                outcome = (name, result, run_id)
    except Exception as e:  # this process's own error: the aggregate closes FAILED with why and
        # the finished repeats' figures, not RUNNING until a sync (issue 43); the cell fails
        close(job, aggregate, None, entries, None,
              stopped=("FAILED", f"the repeats failed: {type(e).__name__}: {e}"))
        raise
    except (KeyboardInterrupt, SystemExit):  # a signal stopped a repeat (its run is KILLED)
        close(job, aggregate, None, entries, None, stopped=("KILLED", "interrupted"))
        raise
    close(job, aggregate, None, entries, None)
    if outcome is None:  # every repeat was kept from before
        done = entries[-1]
        outcome = (done["name"], Result("", status="FINISHED", metrics=done["metrics"]),
                   done["run_id"])
    return outcome


# What two converge groups of a sweep must share to compare their step counts: one experiment
# but for the framework (its model and dims, data, target, precision, machine, batch)
_SAME_EXPERIMENT_TAGS = ("fxtrack.model", "fxtrack.scenario", "fxtrack.precision",
                         "fxtrack.hardware", "fxtrack.devices", "fxtrack.data_digest")


def sample_efficiency_tags(done: list[dict[str, Any]], tags: dict[str, str],
                           params: dict[str, Any], jobs_dir) -> dict[str, str]:
    """A converge aggregate's steps to target against the sweep's first group of the same
    experiment (closed before it: repeats run round-robin), by the report's rule
    (the converge section's sample_efficiency): ``fxtrack.sample_efficiency`` = same / more_steps /
    fewer_steps / undecided, and the reference's framework; {} where there is none."""
    from fxtrack import scenarios
    from fxtrack.config.schema import apart_from_identity

    mine = [e["metrics"]["steps_to_target"] for e in done if "steps_to_target" in e["metrics"]]
    if not done or "reached_target" not in done[0]["metrics"]:
        return {}
    # the report's rule, declared by the scenario's section (converge's)
    scenario = scenarios.SCENARIOS.get(tags.get("fxtrack.scenario", ""))
    sample_efficiency = scenario and scenario.part("section", "sample_efficiency")
    if not sample_efficiency:
        return {}
    apart = apart_from_identity()  # the keys that never make another experiment

    def held_of(p: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in p.items() if not k.startswith("framework.") and k not in apart}

    held = held_of(params)
    for path in sorted((Path(jobs_dir) / AGGREGATES_DIR).glob("*.json"),
                       key=lambda p: p.stat().st_mtime):
        other = json.loads(path.read_text())
        if other["tags"].get("fxtrack.framework") == tags.get("fxtrack.framework") or any(
                other["tags"].get(k) != tags.get(k) for k in _SAME_EXPERIMENT_TAGS):
            continue
        if held_of(other.get("params", {})) != held:
            continue
        theirs = [e["metrics"]["steps_to_target"] for e in job_files(jobs_dir, path.stem)
                  if e.get("status") == "FINISHED" and "steps_to_target" in e["metrics"]]
        found = sample_efficiency(mine, theirs)
        if found is None:
            return {}
        return {"fxtrack.sample_efficiency": found[2],
                "fxtrack.sample_efficiency_reference": other["tags"]["fxtrack.framework"],
                "fxtrack.sample_efficiency_steps_x": f"{found[0]:.3f}"}
    return {}


def close_open(stopped: Optional[tuple[str, str]] = None) -> list[dict[str, Any]]:
    """Close every aggregate this process left open (a signal stopped the sweep: ``stopped``
    = ("KILLED", why); a sweep's end: None), each with its finished repeats' figures."""
    closed = []
    for aggregate, left in list(_OPEN.items()):
        closed.append(close(left.job, aggregate, left.parent, left.entries(), left.jobs_dir,
                            stopped=stopped))
    return [c for c in closed if c]


CLOSERS.append(close_open)


def close(job, aggregate: str, parent: Optional[str], entries: list[dict[str, Any]],
          jobs_dir, stopped: Optional[tuple[str, str]] = None) -> dict[str, Any]:
    """Log the aggregate's figures and close it; in a sweep, leave its line for the closing
    table in ``jobs_dir/aggregates``. ``stopped``: (status, why) when the repeats were cut
    short. Returns the aggregate entry."""
    from fxtrack.tracking import records

    if aggregate in _CLOSED:
        return {}
    _OPEN.pop(aggregate, None)
    _CLOSED.add(aggregate)
    done = [e for e in entries if e["status"] == "FINISHED"]
    metrics = aggregate_metrics([e["metrics"] for e in done])
    name = _name_and_tags(job, Path("."))[0]  # the repeats' name without their -r<i>
    tags = aggregate_tags(entries, job.conf.repeats)
    params = (done or entries)[0].get("params", {}) if entries else {}
    if jobs_dir is not None and stopped is None:
        tags.update(sample_efficiency_tags(done, tags, params, jobs_dir))
    status = "FINISHED" if done else "FAILED"
    if stopped is not None:
        status = stopped[0]
        tags.update({"fxtrack.status": "failed", "fxtrack.error": stopped[1][:500]})
    line = summary(name, metrics, tags)
    if stopped is not None:
        line += f"  {status}: {stopped[1]}"
    tags.update(records.note(line))
    record = records.parent_record(aggregate, job.uri, job.conf.tracking.experiment, name, tags,
                                   status, parent, metrics)
    record["params"] = params
    run_id, where = job.tracker.log(record, {})
    print(f"{line}  [{where}]", file=sys.stderr, flush=True)
    entry = {"name": name, "status": record["status"], "metrics": metrics, "tags": tags,
             "run_id": run_id, "params": params}
    if jobs_dir is not None:
        out = Path(jobs_dir) / AGGREGATES_DIR
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{aggregate}.json").write_text(json.dumps(entry))
    return entry
