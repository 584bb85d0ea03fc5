"""Hydra callback for multiruns: validate every job first, open one MLflow parent run for the
sweep, and close it with a table of the jobs (exit status 1 if any failed)."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from fxtrack.orchestrator.app import JOBS_DIR, SWEEP_ID_ENV, SWEEP_TOTAL_ENV, ConfigError, validate


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """The override lists of every job the basic sweeper will launch."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    parsed = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


class SweepRun(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        jobs = sweep_jobs(config)
        loader = GlobalHydra.instance().config_loader()
        for overrides in jobs:  # fail before any work starts, naming the job
            cfg = loader.load_sweep_config(config, list(overrides))
            with read_write(cfg), open_dict(cfg):
                del cfg["hydra"]
            try:
                validate(cfg)
            except ConfigError as e:
                print(f"fxtrack: invalid config in job [{' '.join(overrides)}]: {e}", file=sys.stderr)
                sys.exit(2)
        os.environ[SWEEP_TOTAL_ENV] = str(len(jobs))
        self.sweep_id = uuid.uuid4().hex
        os.environ[SWEEP_ID_ENV] = self.sweep_id
        self.started = time.time()
        self._deliver(config, "RUNNING")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        jobs_dir = Path(config.hydra.sweep.dir) / JOBS_DIR
        jobs = [json.loads(p.read_text()) for p in sorted(jobs_dir.glob("*.json"))]
        failed = [j for j in jobs if j["status"] != "FINISHED"]
        print(closing_table(jobs), file=sys.stderr)
        self._deliver(config, "FAILED" if failed else "FINISHED")
        if failed:
            print(f"fxtrack: {len(failed)} of {len(jobs)} jobs failed", file=sys.stderr)
            sys.exit(1)

    def _deliver(self, config: DictConfig, status: str) -> None:
        from fxtrack.tracking import records, spool, writer

        uri = writer.tracking_uri(config.tracking.uri, config.hydra.runtime.cwd)
        name = f"sweep-{time.strftime('%Y%m%d-%H%M%S', time.localtime(self.started))}"
        record = records.parent_record(self.sweep_id, uri, config.tracking.experiment, name,
                                       {"fxtrack.sweep": " ".join(config.hydra.overrides.task)},
                                       status)
        entry = spool.write(record, {})
        try:
            writer.deliver(entry, uri)
        except writer.TrackingUnavailable as e:
            print(f"fxtrack: could not log the sweep's parent run: {e}; kept in {entry}, "
                  "run `fxtrack sync` later", file=sys.stderr)


def closing_table(jobs: list[dict[str, Any]]) -> str:
    """The sweep's jobs with their status and headline figures, as a text table."""
    rows = [("run", "status", "samples/s", "step p50 ms", "peak MiB", "note")]
    for j in jobs:
        m = j["metrics"]
        peak = m.get("peak_mem_device_mib", m.get("peak_rss_mib"))
        note = j["error"] or ("" if j["guard"] == "ok" else f"guard: {j['guard']}")
        rows.append((j["name"], j["status"], _fmt(m.get("throughput_samples_per_s")),
                     _fmt(m.get("step_time_ms_p50")), _fmt(peak, 0), (note or "")[:60]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(["", *lines, ""])


def _fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"
