"""``scenario=fit``: the largest batch_size (or seq_len) that trains within a memory budget.

One parent run; each probe is a child run in its own worker (a short training run: warm-up and
a few timed steps), so an out-of-memory kill costs only that probe. The search (``search``, a
pure function of a probe callable) starts from the pre-check's estimate, doubles until a probe
does not fit, then bisects until the largest fit and the smallest miss are within
``scenario.resolution``, never past ``scenario.max_probes`` probes or ``scenario.max_batch``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import uuid
from pathlib import Path
from typing import Callable, Optional

from fxtrack import families
from fxtrack.worker.protocol import Result
from fxtrack.search import bracket_search

FITS, OUT_OF_MEMORY, OVER_BUDGET, KILLED = "fits", "out_of_memory", "over_budget", "killed"
# The frameworks' own out-of-memory errors: torch OutOfMemoryError, XLA RESOURCE_EXHAUSTED,
# TensorFlow ResourceExhaustedError (and the allocator's plain "out of memory").
_OOM = re.compile(r"OutOfMemoryError|RESOURCE_EXHAUSTED|ResourceExhaustedError|out of memory",
                  re.IGNORECASE)
PROBE_STEPS, PROBE_WARMUP = 3, 1  # a probe's timed and untimed steps unless steps= is given


@dataclasses.dataclass(frozen=True)
class Probe:
    """One probed value and what came of it."""

    value: int
    fit: str  # FITS | OUT_OF_MEMORY | OVER_BUDGET | KILLED
    peak_mib: Optional[float] = None
    throughput: Optional[float] = None

    @property
    def fits(self) -> bool:
        return self.fit == FITS


def tolerance(at: int, resolution: float) -> int:
    """How far apart the largest fit and the smallest miss may stop: a fraction of the fit
    (``resolution`` < 1) or a fixed step (>= 1), at least 1."""
    return max(1, math.ceil(at * resolution)) if resolution < 1 else max(1, int(resolution))


def search(probe: Callable[[int], Probe], start: int, max_value: int, max_probes: int,
           resolution: float, budget_mib: Optional[float] = None) -> list[Probe]:
    """Probe from ``start``: double while it fits (to ``max_value``), halve while it does not
    (to 1), then bisect the bracket to ``resolution``; at most ``max_probes`` probes.

    With a ``budget_mib``, once two probes fit, their line of peak memory guides the next: a
    hop to just below where it meets the budget when that is beyond the double, just past it
    when it is nearer (closing the bracket in one probe), and inside a bracket the point where
    it meets the budget rather than the middle. A linear model's answer takes a few probes, not
    log2 hops and bisections, each of them a worker at a large batch.
    Returns the probes in order; the answer is ``largest(probes)``."""
    probes: list[Probe] = []

    def run(value: int) -> bool:
        probes.append(probe(value))
        return probes[-1].fits

    guided = [False]  # the last hop came from the line (to just past where it meets the budget)

    def grow(value: int) -> int:
        # a line whose guess past the budget still fitted underestimates: double instead
        meets = None if guided[0] else _meets(probes, budget_mib)
        guided[0] = meets is not None and meets <= 2 * value
        if meets is None:
            return 2 * value
        if meets > 2 * value:
            return int(0.95 * meets)
        return max(value + 1, math.ceil(meets + tolerance(value, resolution) / 2))

    step = tolerance(1, resolution) if resolution >= 1 else 1
    last_split: list = [None, False]  # the last middle probed, and whether the line chose it

    def split(fit: int, miss: int) -> int:
        # a peak that grows slower than the line (an allocator's plateau) keeps its guesses
        # just under the budget, creeping: after a guided middle fitted, bisect the next one
        trust_line = not (last_split[1] and last_split[0] == fit)
        middle = (fit + miss) // 2
        meets = _meets(probes, budget_mib) if trust_line else None
        line_guided = meets is not None and fit + 1 < int(0.99 * meets) < miss - 1
        if line_guided:
            middle = int(0.99 * meets)  # just inside the budget: it should fit
        if step > 1 and (middle // step) * step > fit:  # on the step's grid where it can be
            middle = (middle // step) * step
        last_split[:] = [middle, line_guided]
        return middle

    bracket_search(run, start, upper=max_value, lower=1, integer=True, max_probes=max_probes,
                   narrow=lambda fit, miss: miss - fit <= tolerance(fit, resolution),
                   grow=grow, split=split)
    return probes


def _meets(probes: list[Probe], budget_mib: Optional[float]) -> Optional[float]:
    """Where the fitting probes' line of peak memory meets the budget (None: no budget, no
    line yet, or a line that does not rise)."""
    line = None if budget_mib is None else linear_fit(
        [(p.value, p.peak_mib) for p in probes if p.fits and p.peak_mib is not None])
    if line is None or line[0] <= 0:
        return None
    return (budget_mib - line[1]) / line[0]


def memory_pressure(probes: list[Probe], value: int, budget_mib: Optional[float]) -> bool:
    """Whether a probe at ``value`` killed from outside (SIGKILL, a timeout) may have run out of
    memory: the fitting probes' line of peak memory reaches 90% of the budget there. Without a
    budget or a line there is no evidence, and the kill is no miss (issue 43: a stray kill at
    ~600 MiB of an 8 GiB budget turned the answer into batch 3)."""
    line = linear_fit([(p.value, p.peak_mib) for p in probes if p.fits and p.peak_mib is not None])
    if budget_mib is None or line is None:
        return False
    return line[0] * value + line[1] >= 0.9 * budget_mib


def stop_reason(probes: list[Probe], max_value: int, max_probes: int, resolution: float) -> str:
    """Why the search ended: ``resolution`` (bracketed), ``max_batch``, ``max_probes`` (the
    answer is then a lower bound) or ``nothing_fits``."""
    best = largest(probes)
    misses = [p.value for p in probes if not p.fits and p.value > best]
    if not best:
        return "nothing_fits"
    if best >= max_value:
        return "max_batch"
    if misses and min(misses) - best <= tolerance(best, resolution):
        return "resolution"
    return "max_probes" if len(probes) >= max_probes else "resolution"


def largest(probes: list[Probe]) -> int:
    """The largest value that fitted; 0 when none did."""
    return max((p.value for p in probes if p.fits), default=0)


def linear_fit(points: list[tuple[float, float]]) -> Optional[tuple[float, float, float]]:
    """Least squares ``peak = slope x value + intercept`` and its r^2; None under two
    distinct values."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    intercept = my - slope * mx
    total = sum((y - my) ** 2 for _, y in points)
    residual = sum((y - slope * x - intercept) ** 2 for x, y in points)
    return slope, intercept, (1.0 - residual / total) if total > 0 else 1.0


def peak_mib(result: Result) -> Optional[float]:
    """The probe's peak: the fullest device's where one was measured (GPU), else peak RSS."""
    m = result.metrics
    return m.get("peak_mem_device_mib", m.get("peak_rss_mib"))


def verdict(result: Result, budget_mib: Optional[float]) -> Optional[str]:
    """What the probe says about fitting; None: it failed for a reason that is not memory (a
    bug, an interrupt), which stops the search instead of counting as a miss."""
    if result.status == "FINISHED":
        peak = peak_mib(result)
        over = budget_mib is not None and peak is not None and peak > budget_mib
        return OVER_BUDGET if over else FITS
    error = result.error or ""
    if result.status == "KILLED":  # interrupted by the user: not a memory verdict
        return None
    if "killed by SIGKILL" in error or "timed out" in error:
        return KILLED
    if _OOM.search(error):
        return OUT_OF_MEMORY
    return None


def fit_metrics(probes: list[Probe], axis: str, seq_len: Optional[int],
                budget_gib: Optional[float], repeat_throughputs: list[float]) -> dict[str, float]:
    """The parent run's figures (docs/contract.md, scenario=fit)."""
    from fxtrack import stats

    best = largest(probes)
    metrics: dict[str, float] = {"fit_probes": float(len(probes))}
    if axis == "batch_size":
        metrics["max_batch_size"] = float(best)
    else:
        metrics["max_seq_len"] = float(best)
    if budget_gib is not None:
        metrics["memory_budget_gib"] = budget_gib
    line = linear_fit([(p.value, p.peak_mib) for p in probes
                       if p.fits and p.peak_mib is not None])
    if line is not None:
        slope, intercept, r2 = line
        metrics["memory_per_sample_mib"] = slope  # per unit of the axis: a sample or a token
        metrics["fixed_memory_mib"] = intercept
        metrics["memory_fit_r2"] = r2
    at_best = [p.throughput for p in probes if p.fits and p.value == best and p.throughput]
    figures = [*at_best[-1:], *repeat_throughputs]
    if figures:
        ci = stats.log_t_interval(figures)
        metrics["throughput_at_max_samples_per_s"] = ci.point
        if len(figures) > 1:
            metrics["throughput_at_max_ci_low"] = ci.low
            metrics["throughput_at_max_ci_high"] = ci.high
        if seq_len is not None:
            metrics["throughput_at_max_tokens_per_s"] = ci.point * (best if axis == "seq_len" else seq_len)
    return metrics


def _probe_job(job, axis: str, value: int):
    """A copy of ``job`` at ``value`` on ``axis``, with the probe's short step counts."""
    conf = job.conf
    steps = conf.steps or PROBE_STEPS
    warmup = PROBE_WARMUP if conf.warmup_steps is None else conf.warmup_steps
    probe = copy.copy(job)
    probe.config = copy.deepcopy(job.config)
    probe.config.update(steps=steps, warmup_steps=warmup)
    if axis == "batch_size":
        probe.conf = dataclasses.replace(conf, batch_size=value, steps=steps, warmup_steps=warmup)
        probe.config["batch_size"] = value
    else:
        probe.conf = dataclasses.replace(conf, steps=steps, warmup_steps=warmup)
        probe.arch = dataclasses.replace(job.arch, dims={**job.arch.dims, "seq_len": value})
        probe.config["model"]["seq_len"] = value
    return probe


def run(job, job_dir: Path, parent: Optional[str]) -> tuple[str, Result, Optional[str]]:
    """Search, one child run per probe, then ``repeats - 1`` more at the found value; returns
    the parent's outcome."""
    from fxtrack.scenarios.fit import check as fit_config
    from fxtrack.config.validate import expected_device_kind
    from fxtrack.orchestrator.job import job_spec
    from fxtrack.tracking import records

    conf, arch, s = job.conf, job.arch, job.conf.scenario
    kind = expected_device_kind(conf.hardware.name)
    have = fit_config.budget(s.memory_gib, kind, conf.devices)
    budget_mib = None if have.bytes is None else have.bytes / 2**20
    # on a GPU the default budget is the framework's own OOM; a set memory_gib also bounds the peak
    bound_mib = budget_mib if (kind == "cpu" or s.memory_gib is not None) else None
    start = fit_config.start_value(arch, s.axis, conf.precision.name, conf.batch_size,
                                   conf.memory.value, kind, have, s.max_batch)
    spec = job_spec(conf, arch, job_dir)
    spec.scenario = "fit"
    # the searched value and the probes' step counts are the probes' names, not the search's:
    # the parent shared its name with a probe at the start value (issue 43)
    spec.steps = spec.warmup_steps = None
    if s.axis == "batch_size":
        spec.batch_size = None
    name = records.run_name(spec, conf.size.name)
    fit_id = uuid.uuid4().hex
    tags = {"fxtrack.framework": conf.framework.name, "fxtrack.model": arch.name,
            "fxtrack.scenario": "fit", "fxtrack.precision": conf.precision.name,
            "fxtrack.devices": str(conf.devices), "fxtrack.hardware": conf.hardware.name,
            "fxtrack.fit_axis": s.axis, "fxtrack.fit_budget_source": have.source,
            "fxtrack.memory": conf.memory.value, "fxtrack.parallel": conf.parallel.value}

    def log_parent(status: str, metrics: dict[str, float],
                   artifacts: Optional[dict] = None) -> Optional[str]:
        record = records.parent_record(fit_id, job.uri, conf.tracking.experiment, name, tags,
                                       status, parent, metrics)
        job.last_record = record
        return job.tracker.log(record, artifacts or {})[0]

    log_parent("RUNNING", {})
    outcome = Result(fit_id, status="FINISHED")
    stopped: list[str] = []

    def measure(value: int, folder: str, repeat: Optional[int] = None) -> Probe:
        child_dir = job_dir / folder
        child_dir.mkdir(parents=True, exist_ok=True)
        found: dict[str, Optional[str]] = {}

        def tag(result: Result) -> dict[str, str]:
            found["fit"] = verdict(result, bound_mib)
            return {"fit": found["fit"] or "failed", "fit_of": fit_id}

        _, result, _ = _probe_job(job, s.axis, value).run(child_dir, fit_id, conf.devices,
                                                          scenario="fit", repeat=repeat,
                                                          tags=tag)
        if found["fit"] == KILLED and not memory_pressure(probes, value, bound_mib):
            # killed from outside (or timed out) where the probes' line sees no memory
            # pressure: not a miss; probed again, and a second kill leaves the answer open
            first = result.error
            again = job_dir / f"{folder}-again"
            again.mkdir(parents=True, exist_ok=True)  # the worker writes its spec.json there
            _, result, _ = _probe_job(job, s.axis, value).run(
                again, fit_id, conf.devices, scenario="fit",
                repeat=repeat, tags=tag)
            if found["fit"] == KILLED:
                stopped.append(f"{s.axis}={value} was stopped twice ({first}; {result.error}) "
                               "with no sign of memory pressure: whether it fits is unknown, "
                               f"so the answer is uncertain (at least {largest(probes) or '-'})")
                raise _Stop
        if found["fit"] is None:  # not a memory verdict: the search cannot go on honestly
            stopped.append(f"{s.axis}={value}: {result.error}")
            raise _Stop
        return Probe(value, found["fit"], peak_mib(result),
                     result.metrics.get("throughput_samples_per_s"))

    probes: list[Probe] = []
    repeats: list[float] = []
    try:
        search(lambda v: _record(probes, measure(v, f"{s.axis}{v}")), start, s.max_batch,
               s.max_probes, s.resolution, bound_mib)
        best = largest(probes)
        for r in range(1, conf.repeats if best else 1):
            extra = measure(best, f"{s.axis}{best}-r{r}", repeat=r)
            if extra.fits and extra.throughput:
                repeats.append(extra.throughput)
    except _Stop:
        outcome.status, outcome.error = "FAILED", stopped[0]
    except Exception as e:  # noqa: BLE001 - a bug in the search: the parent closes FAILED with
        # what was probed, not RUNNING for ever (issue 43)
        outcome.status, outcome.error = "FAILED", f"the search failed: {type(e).__name__}: {e}"
    except (KeyboardInterrupt, SystemExit):  # a signal stopped a probe (its run is KILLED):
        # close this parent too, with what was probed, before the sweep exits
        tags.update({"fxtrack.status": "failed", "fxtrack.error": "interrupted"})
        log_parent("KILLED", fit_metrics(probes, s.axis, None, None if budget_mib is None
                                         else budget_mib / 1024, repeats))
        raise
    seq_len = getattr(arch, "seq_len", None) if families.of(arch).seq_len_search else None
    outcome.metrics = fit_metrics(probes, s.axis, seq_len,
                                  None if budget_mib is None else budget_mib / 1024, repeats)
    best = largest(probes)
    if outcome.status == "FINISHED" and not best:
        outcome.status, outcome.error = "FAILED", f"no {s.axis} fits, down to 1"
    tags["fxtrack.status"] = "ok" if outcome.status == "FINISHED" else "failed"
    if outcome.error:
        tags["fxtrack.error"] = outcome.error[:500]
    tags["fxtrack.fit_stop"] = stop_reason(probes, s.max_batch, s.max_probes, s.resolution)
    capped = {"max_batch": " (at scenario.max_batch)", "max_probes": " (a lower bound: "
              "scenario.max_probes reached before the search closed its bracket)"}.get(tags["fxtrack.fit_stop"], "")
    line = (f"{name}: largest {s.axis} that fits: {best or '-'}{capped} in {len(probes)} probes "
            f"(budget {_gib(budget_mib)}, {have.source})")
    if outcome.error:  # the terminal says why the search ended, as the parent's tag does
        line += f"; search stopped: {outcome.error}"
    tags.update(records.note(line))
    run_id = log_parent(outcome.status, outcome.metrics, _plot(probes, outcome.metrics, budget_mib,
                                                              name, job_dir))
    print(line, flush=True)
    return name, outcome, run_id


class _Stop(Exception):
    """A probe failed for a reason that is not memory."""


def _record(probes: list[Probe], probe: Probe) -> Probe:
    probes.append(probe)  # kept as they come: a stopped search still reports what it probed
    return probe


def _gib(mib: Optional[float]) -> str:
    return "none" if mib is None else f"{mib / 1024:.2f} GiB"


def _plot(probes: list[Probe], metrics: dict[str, float], budget_mib: Optional[float],
          name: str, job_dir: Path) -> dict:
    """The parent run's chart of peak memory against the axis (its section, fxtrack.scenarios.fit.section, draws it)."""
    try:
        from fxtrack.scenarios.fit import section as fit_report
    except ImportError:  # matplotlib missing: the figures are logged either way
        return {}
    path = job_dir / "fit_memory.png"
    series = {name: ([(p.value, p.peak_mib, p.fit) for p in probes],
                     metrics.get("memory_per_sample_mib"), metrics.get("fixed_memory_mib"))}
    fit_report.plot(series, budget_mib, path, "probe " + ("batch_size" if "max_batch_size" in metrics
                                                          else "seq_len"))
    return {"fit_memory.png": path}

