"""Hydra callback for multiruns: validate every job first, open one MLflow parent run for the
sweep, and close it with a table of the jobs (exit status 1 if any failed or is only spooled;
an interrupted sweep's parent is closed KILLED by ``close_interrupted``)."""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict, read_write

from fxtrack.config.validate import ConfigError, Refused, composition_error, owners, validate
from fxtrack.orchestrator import from_run
from fxtrack.tracking.records import HEADLINE, sync_advice

# Set for the sweep's jobs (they run in this process, or under submitit in processes of their own).
SWEEP_ID_ENV, SWEEP_TOTAL_ENV = "FXTRACK_SWEEP_ID", "FXTRACK_SWEEP_TOTAL"
SWEEP_CONFIGS_ENV = "FXTRACK_SWEEP_CONFIGS"  # distinct configs in the sweep (jobs / repeats)
JOBS_DIR = "fxtrack_jobs"  # in the sweep directory: one status file per job, for the closing table
AGGREGATES_DIR = "aggregates"  # beside the job status files: one file per config's aggregate
MAX_TAG_CHARS = 5000  # an MLflow tag value's limit in the older stores
_ACTIVE: "SweepRun | None" = None  # the sweep in progress in this process, for close_interrupted


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """The override lists of every config the basic sweeper will launch (once per repeat):
    the sweep's ``hydra.sweeper.params`` (e.g. an ``experiment=`` preset's) first, as
    BasicSweeper puts them, then the command line's; the hidden repeat dimension left out."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()
              if "FXTRACK_REPEAT" not in key]
    parsed = OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task))
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


class SweepRun(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        jobs = sweep_jobs(config)
        loader = GlobalHydra.instance().config_loader()
        self.not_supported: list[str] = []  # "[overrides]: why" of the cells that will be skipped
        swept: set[str] = set()  # the scenarios the jobs run
        yardsticks: dict[tuple, dict[str, str | None]] = {}  # calibrate_first's cells
        for overrides in jobs:  # fail before any work starts, naming the job
            try:
                cfg = loader.load_sweep_config(config, list(overrides))
            except Exception as e:  # noqa: BLE001 - Hydra would only warn of it (a callback's)
                line = composition_error(e)
                if line is None:
                    raise
                print(f"fxtrack: invalid config in job [{' '.join(overrides)}]: {line}",
                      file=sys.stderr)
                sys.exit(2)
            with read_write(cfg), open_dict(cfg):
                del cfg["hydra"]
            swept.add(str(cfg.scenario.name))
            if cfg.hardware.name == "cpu" or (cfg.hardware.name == "auto" and no_gpu()):
                yardsticks.setdefault((str(cfg.precision.name), cfg.hardware.cpu_threads), {})[
                    str(cfg.framework.name)] = cfg.framework.get("python")
            try:
                if from_run.run_id(cfg):  # the run's model and data (fxtrack.orchestrator.from_run)
                    from_run.apply(cfg, self._uri(config))
                validate(cfg, sweep=True)
            except Refused as e:  # the task skips it again when its turn comes (app.skip)
                from fxtrack.tracking.records import redact_overrides

                self.not_supported.append(f"[{' '.join(redact_overrides(list(overrides)))}]: {e}")
            except ConfigError as e:
                print(f"fxtrack: invalid config in job [{' '.join(overrides)}]: {e}", file=sys.stderr)
                sys.exit(2)
        unused = sorted({key for job in jobs for o in job for key in [_scenario_key(o)]
                         if key and not set(owners(key)) & swept})
        if unused:  # set for a scenario no job runs: a mistake, not a per-job drop
            print(f"fxtrack: invalid config: scenario.{unused[0]} is an option of scenario="
                  f"{'/'.join(owners(unused[0]))}, which this sweep does not run "
                  f"({', '.join(sorted(swept))})", file=sys.stderr)
            sys.exit(2)
        if self.not_supported:
            print(f"fxtrack: {len(self.not_supported)} of {len(jobs)} jobs are not supported and "
                  "will be skipped (not run, not logged in MLflow):\n  "
                  + "\n  ".join(self.not_supported), file=sys.stderr, flush=True)
        self._check_target(config)
        calibrate_first(yardsticks)
        # repeats=N: the hidden sweep dimension launches the job list N times over (round-robin)
        os.environ[SWEEP_TOTAL_ENV] = str(len(jobs) * max(1, int(config.get("repeats", 1) or 1)))
        os.environ[SWEEP_CONFIGS_ENV] = str(len(jobs))
        self.sweep_id = uuid.uuid4().hex
        os.environ[SWEEP_ID_ENV] = self.sweep_id
        self.started = time.time()
        self.config, self.spooled = config, False
        global _ACTIVE
        _ACTIVE = self
        self._deliver(config, "RUNNING")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        for close_open in CLOSERS:  # an aggregate whose last repeat's cell raised before its close
            close_open(None)
        jobs_dir = Path(config.hydra.sweep.dir) / JOBS_DIR
        jobs = [json.loads(p.read_text()) for p in sorted(jobs_dir.glob("*.json"))]
        skipped = [j for j in jobs if j.get("skipped")]
        unsupported = [j for j in jobs if _unsupported(j) and not j.get("skipped")]
        failed = [j for j in jobs if (j["status"] != "FINISHED" and not _unsupported(j))
                  or numbers_wrong(j.get("guard", "ok"))]
        verdict = closing_table(jobs)
        # each aggregate with its id (its file's name), which its repeats' job files name
        aggregates = [dict(json.loads(p.read_text()), id=p.stem)
                      for p in sorted((jobs_dir / AGGREGATES_DIR).glob("*.json"))]
        timed_work = [a for a in aggregates if not _converges(a)]  # converge's: its own table
        if timed_work:
            verdict += aggregate_table(timed_work)
        verdict += scenario_tables(jobs, aggregates)
        print(verdict, file=sys.stderr)
        common_rate_windows(config, jobs_dir)  # before the report, which compares them
        frameworks = sorted({j["tags"]["fxtrack.framework"] for j in jobs
                             if j.get("tags", {}).get("fxtrack.framework")})
        code_params, code_csv = code_size(frameworks)
        artifacts: dict[str, Any] = {"code_size.csv": code_csv} if frameworks else {}
        artifacts.update(self._report(config, Path(config.hydra.sweep.dir) / "report"))
        self._deliver(config, "FAILED" if failed else "FINISHED", note=verdict.strip("\n"),
                      params=code_params, artifacts=artifacts)
        global _ACTIVE
        _ACTIVE = None
        spooled = [j for j in jobs if j.get("run_id") is None and not j.get("skipped")]
        if spooled or self.spooled:
            print(f"fxtrack: {len(spooled) + self.spooled} of {len(jobs) - len(skipped) + 1} runs "
                  "(the sweep's parent included) are only in the local spool: "
                  f"{sync_advice(self._uri(config))}", file=sys.stderr)
        if skipped:  # a matrix may hold combinations a framework has no path for
            print(f"fxtrack: {len(skipped)} of {len(jobs)} jobs were not supported and skipped "
                  "before any work: not run, not logged as runs (the sweep's parent run lists "
                  "them in its fxtrack.not_supported tag)", file=sys.stderr)
        if unsupported:  # found by the worker (e.g. an exporter without a path for one model)
            print(f"fxtrack: {len(unsupported)} of {len(jobs)} jobs are not supported by their "
                  "framework (logged as such; see the report's deployment and memory tables)",
                  file=sys.stderr)
        if failed:
            print(f"fxtrack: {len(failed)} of {len(jobs)} jobs failed", file=sys.stderr)
        from fxtrack.tracking.ui import next_steps

        print(next_steps(self._uri(config), getattr(self, "run_id", None),
                         "the sweep's parent run (its report/ artifacts)",
                         config.tracking.experiment), file=sys.stderr)
        if failed or spooled or self.spooled:
            sys.exit(1)

    def _check_target(self, config: DictConfig) -> None:
        """A permanent problem with the tracking target (bad scheme, empty or deleted
        experiment) stops the sweep before any work; a server that is down does not."""
        from fxtrack.tracking import target, writer

        uri = self._uri(config)
        try:
            writer.check_target(uri, config.tracking.experiment)
        except target.TrackingRejected as e:
            print(f"fxtrack: {e}", file=sys.stderr)
            sys.exit(2)
        except target.TrackingUnavailable as e:
            print(f"fxtrack: the tracking server is not answering ({e}); results will be "
                  f"kept in the local spool: {sync_advice(uri)}", file=sys.stderr)

    @staticmethod
    def _uri(config: DictConfig) -> str:
        from fxtrack.tracking import target

        return target.tracking_uri(config.tracking.uri, config.hydra.runtime.cwd)

    def _report(self, config: DictConfig, out: Path) -> dict[str, Any]:
        """The report of this sweep's runs (fxtrack.report, in this process, on the runs whose
        parent is this sweep's run), its files as the parent's artifacts: the comparison one
        click from the runs list. Nothing when the parent is only spooled or the report fails
        (it is a convenience: the runs are logged either way)."""
        run_id = getattr(self, "run_id", None)
        if run_id is None:
            return {}
        import contextlib
        import io

        from fxtrack.report import cli as report_cli

        argv = ["--experiment", config.tracking.experiment, "--uri", self._uri(config),
                "--filter", f"tags.`mlflow.parentRunId` = '{run_id}'", "--out", str(out),
                "--no-log"]
        try:
            with contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                if report_cli.main(argv) != 0:
                    return {}
        except Exception as e:  # noqa: BLE001 - a report bug must not fail the benchmark sweep
            print(f"fxtrack: the sweep's report could not be made ({type(e).__name__}: {e})",
                  file=sys.stderr)
            return {}
        return {"report": out}

    def _record(self, config: DictConfig, status: str, note: str | None) -> dict[str, Any]:
        from fxtrack.tracking import records

        name = f"sweep-{time.strftime('%Y%m%d-%H%M%S', time.localtime(self.started))}"
        overrides = records.redact_overrides(list(config.hydra.overrides.task))
        tags = {"fxtrack.sweep": " ".join(overrides)}
        if self.not_supported:  # skipped cells are no runs: the parent says which and why
            tags["fxtrack.not_supported"] = "\n".join(self.not_supported)[:MAX_TAG_CHARS]
        if note:
            tags.update(records.note(note))
        return records.parent_record(self.sweep_id, self._uri(config), config.tracking.experiment,
                                     name, tags, status, start_time_ms=int(self.started * 1000))

    def _deliver(self, config: DictConfig, status: str, note: str | None = None,
                 params: dict[str, Any] | None = None,
                 artifacts: dict[str, Any] | None = None) -> None:
        from fxtrack.tracking import records, spool, writer

        uri = self._uri(config)
        record = self._record(config, status, note)
        record["params"] = params or {}
        run_id, _, message = writer.log_record(record, artifacts or {}, uri)
        self.spooled = run_id is None
        if status == "RUNNING":
            self.run_id = run_id
            # the sweep's last word if this process is killed outright: sync closes it FAILED
            gone = records.fallback(self._record(config, "FAILED", f"FAILED: {GONE}"))
            gone["tags"]["fxtrack.error"] = GONE
            try:
                self.held = spool.hold(gone, {})
            except spool.SpoolError as e:
                print(f"fxtrack: no fallback for the sweep's parent in the spool ({e})",
                      file=sys.stderr)
        else:
            spool.drop(getattr(self, "held", None))
        if message:
            print(f"fxtrack: the sweep's parent run: {message.removeprefix('fxtrack: ')}",
                  file=sys.stderr)


@functools.lru_cache(maxsize=1)
def no_gpu() -> bool:
    """No NVIDIA GPU answers NVML here: hardware=auto runs on the CPU."""
    from fxtrack.measure import peak

    return peak.gpu_capability() is None


def calibrate_first(cells: dict[tuple, dict[str, str | None]]) -> None:
    """Before a CPU sweep's first job: every framework it runs probed at each precision and
    thread count it uses (those not cached), so each of its runs' MFU is against one machine
    yardstick (calibration.yardstick), not one that rises as later cells probe their frameworks.
    A failure here is left to the jobs, which calibrate as they would alone."""
    from fxtrack.orchestrator import calibration

    for (precision, threads), pythons in cells.items():
        try:
            calibration.calibrate("cpu", precision, "cpu", pythons, threads=threads,
                                  only=sorted(pythons))
        except Exception as e:  # noqa: BLE001 - the runs still calibrate their own framework
            print(f"fxtrack: calibrating before the sweep failed ({type(e).__name__}: {e}); each "
                  "run calibrates its own framework", file=sys.stderr)


GONE = ("the sweep's orchestrator was gone before it closed the sweep (killed: SIGKILL, the "
        "OOM killer, a reboot); closed by fxtrack sync")


def code_size(frameworks: list[str]) -> tuple[dict[str, Any], str]:
    """Code size of each framework's implementation (the same on every run of this fxtrack
    version, so logged once, on the sweep's parent): params ``code_sloc.<framework>`` (and lloc,
    cc) and the whole table (every dimension) as CSV."""
    import fxtrack
    from fxtrack.measure.complexity import code_metrics

    figures = {fw: code_metrics(fw) for fw in frameworks}
    params: dict[str, Any] = {"fxtrack.version": fxtrack.__version__} if frameworks else {}
    for fw, m in figures.items():
        params.update({f"{key}.{fw}": int(m[key]) for key in ("code_sloc", "code_lloc", "code_cc")})
    keys = sorted({k for m in figures.values() for k in m})
    rows = [",".join(["metric", *frameworks])]
    rows += [",".join([k, *(f"{figures[fw].get(k, 0):g}" for fw in frameworks)]) for k in keys]
    return params, "\n".join(rows) + "\n"


def numbers_wrong(guard: str) -> bool:
    """A guard that says the run's numbers are wrong (a loss gone NaN / inf) fails the exit
    status, single run or sweep; a loss that did not fall in a few steps stays a warning."""
    from fxtrack.scenarios.timed import NOT_FINITE

    return guard == NOT_FINITE


def skipped_job(name: str, why: str) -> dict[str, Any]:
    """The job file of a cell refused before any work (no worker, no MLflow run)."""
    return {"name": name, "status": "NOT SUPPORTED", "guard": "ok", "error": why, "metrics": {},
            "run_id": None, "tags": {"fxtrack.unsupported": "true"}, "params": {},
            "aggregate": None, "skipped": True}


# What closes the parents this process left open (repeats.close_open, registered by that module
# as it is imported): called with (status, why) when a signal stops the sweep, None at its end.
CLOSERS: list = []


def common_rate_plan(jobs: dict[int, dict[str, Any]]) -> list[tuple[float, list[int], str]]:
    """The windows a sweep's rate searches lack for one rate every framework and policy served:
    per group of searches of one model and options (two or more, one window each), the rate,
    the job numbers that need a window at it, and a line saying why. The searches' probes lie
    on one power-of-two grid, but each walks it from its own start: where no probed rate passed
    in all of them, the grid's highest rate at or below every search's answer is one each
    served by its answer, probed once more where it was not."""
    groups: dict[tuple, dict[int, dict[str, Any]]] = {}
    for num, j in jobs.items():
        p, t = j.get("params", {}), j.get("tags", {})
        # a finished rate search: what logs the highest rate under the SLOs
        if ("max_rate_under_slo_rps" not in j.get("metrics", {}) or j.get("status") != "FINISHED"
                or p.get("scenario.rate") != "search" or t.get("fxtrack.repeat_of")
                or p.get("scenario.concurrency") not in (None, "None", "")):
            continue
        key = tuple(sorted((k, v) for k, v in p.items()
                           if k.startswith(("model.", "scenario.", "data.", "size."))
                           and k != "scenario.batching")) + tuple(
            t.get(f"fxtrack.{k}") for k in ("model", "precision", "devices", "hardware"))
        groups.setdefault(key, {})[num] = j
    plan = []
    for cells in groups.values():
        if len(cells) < 2:
            continue
        passed = [{r for r, verdict in c.get("probes", []) if verdict == "pass"}
                  for c in cells.values()]
        if set.intersection(*passed):
            continue  # the report's common-rate table has one already
        answers = [c["metrics"].get("max_rate_under_slo_rps") or 0.0 for c in cells.values()]
        names = ", ".join(c["name"] for c in cells.values())
        if min(answers) <= 0:
            plan.append((0.0, [], f"no common rate for {names}: a search served no rate"))
            continue
        rate = 2.0 ** math.floor(math.log2(min(answers)))
        need = [num for num, c in cells.items()
                if rate not in {r for r, _ in c.get("probes", [])}]
        plan.append((rate, need, f"{rate:g} req/s, the highest rate on the searches' grid at "
                     f"or below every one's answer, for {names}"))
    return plan


def common_rate_windows(config: DictConfig, jobs_dir: Path) -> None:
    """One window at a rate every framework and policy served (``common_rate_plan``), run as
    a fixed-rate serve job tagged a probe of its search: the report's common-rate table then
    compares them at one offered load."""
    files = {int(p.stem): json.loads(p.read_text()) for p in sorted(jobs_dir.glob("*.json"))}
    plan = common_rate_plan(files)
    if not plan:
        return
    overrides = sweep_jobs(config)
    for rate, need, why in plan:
        if not need:
            print(f"fxtrack: {why}", file=sys.stderr)
            continue
        print(f"fxtrack: serving: a window at {why}", file=sys.stderr, flush=True)
        for num in need:
            job = files[num]
            own = [o for o in overrides[num % len(overrides)]
                   if o.split("=", 1)[0].lstrip("+~") not in ("scenario.rate", "repeats")]
            cmd = [sys.executable, "-m", "fxtrack", *own, f"scenario.rate={rate:g}",
                   f"scenario.probe_of={job['tags'].get('fxtrack.result_id', '')}",
                   f"hydra.run.dir={jobs_dir.parent / 'common-rate' / f'{num:04d}'}"]
            done = subprocess.run(cmd, stdin=subprocess.DEVNULL, check=False)
            if done.returncode:
                print(f"fxtrack: the common-rate window of {job['name']} exited "
                      f"{done.returncode}: the report compares the rates the searches probed",
                      file=sys.stderr)


def close_interrupted(status: str = "KILLED", why: str = "interrupted") -> list:
    """Close the parents this process left open and the sweep in progress (if any) as
    ``status``: called when a signal stops it. Returns the parents closed besides the sweep."""
    global _ACTIVE
    closed = [entry for close_open in CLOSERS for entry in close_open((status, why))]
    sweep, _ACTIVE = _ACTIVE, None
    if sweep is not None:
        sweep._deliver(sweep.config, status)
    return closed


def closing_table(jobs: list[dict[str, Any]]) -> str:
    """The sweep's jobs with their status and headline figures, as a text table."""
    rows = []
    for j in jobs:
        m = j["metrics"]
        peak = m.get("peak_mem_device_mib", m.get("peak_rss_mib"))
        note = j["error"] or ("" if j["guard"] == "ok" else f"guard: {j['guard']}")
        status = "NOT SUPPORTED" if _unsupported(j) else j["status"]
        if j.get("skipped"):  # refused before any work: no MLflow run to look for
            status = "NOT SUPPORTED (not run)"
        # the job's own headline where it has no throughput (serve: its max rate; converge: its
        # time to target), never a figure the row shows elsewhere or a cost (compile time)
        figure = _fmt(m.get("throughput_samples_per_s")) if "throughput_samples_per_s" in m else \
            next((f.format(m[k]) for k, f in HEADLINE if k in m and k not in NOT_HEADLINE), "-")
        rows.append([j["name"], status, figure, _fmt(m.get("step_time_ms_p50")), _fmt(peak, 0),
                     note or ""])  # wrapped to the terminal's width, never cut
    # a figure other than throughput names its own unit in its cell ("to target 2.6 s")
    return _text("Jobs:", ["run", "status", "samples/s", "step p50 ms", "peak MiB", "note"], rows,
                 whole=("status",))


def scenario_tables(jobs: list[dict[str, Any]], aggregates: list[dict[str, Any]]) -> str:
    """Each scenario's own closing table (its section's ``closing_table``: fit's answers,
    serve's rates, converge's times to target), in the registry's order; "" where none has one."""
    from fxtrack import scenarios

    return "".join(table(jobs, aggregates)
                   for _, table in scenarios.with_part("section", "closing_table"))


# the closing table's own columns, and a cost that is no headline
NOT_HEADLINE = ("step_time_ms_p50", "compile_time_s", "peak_mem_device_mib", "peak_rss_mib")


def aggregate_table(aggregates: list[dict[str, Any]]) -> str:
    """The sweep's aggregates (repeats=N): median throughput with its 95% interval, repeats,
    contention."""
    rows = []
    for a in aggregates:
        m, t = a["metrics"], a["tags"]
        thr = m.get("throughput_samples_per_s")
        low, high = m.get("throughput_ci_low"), m.get("throughput_ci_high")
        note = (f"contended in {t['fxtrack.contended_repeats']}" if t.get("fxtrack.contended_repeats")
                else "")
        rows.append([a["name"],
                     f"{t.get('fxtrack.repeats', '0')}/{t.get('fxtrack.repeats_requested', '?')}",
                     _fmt(thr), "-" if low is None else f"[{low:,.1f}, {high:,.1f}]",
                     "-" if "throughput_rel_ci" not in m else f"{m['throughput_rel_ci'] / 2:.1%}",
                     note])
    return _text("Aggregates (median of the repeats, 95% Student-t interval of the mean log):",
                 ["config", "repeats", "samples/s (median)", "95% interval", "+-%", "note"], rows)


def _converges(entry: dict[str, Any]) -> bool:
    """A converge run's (or aggregate's) entry: its figure is the time to a target."""
    return "reached_target" in entry.get("metrics", {})


def _text(title: str, header: list[str], rows: list[list[str]],
          whole: tuple[str, ...] = ()) -> str:
    """The report's one text renderer (imported here: pandas and matplotlib load only when a
    sweep ends), with a blank line either side as the console shows it."""
    from fxtrack.report.render import text_table
    from fxtrack.report.tables import Table

    return "\n".join(["", text_table(Table(title, header, rows, whole=whole)), ""])


def _unsupported(job: dict[str, Any]) -> bool:
    """A job the worker found no path for (NotSupported): fxtrack.unsupported=true."""
    return job.get("tags", {}).get("fxtrack.unsupported") == "true"


def _fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _scenario_key(override: str) -> str | None:
    """``scenario.<option>=...`` -> the option's top key (``slo`` of ``scenario.slo.e2e_ms``)."""
    key = override.lstrip("+~").split("=", 1)[0]
    return key.split(".")[1] if key.startswith("scenario.") else None
