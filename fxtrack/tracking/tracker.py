"""Where one job's runs go, and everything on the way there: MLflow loaded while the worker
starts, the run's fallback held in the spool while its worker runs, the log itself (spooled,
then delivered), the run's streamed children held as they end and logged after it, and a
parent run's held close. The orchestrator's ``Job`` owns one ``Tracker``; nothing else logs a
job's runs. MLflow is imported when the log needs it, never with this module."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import uuid
from pathlib import Path

from fxtrack import scenarios
from fxtrack.tracking import records, spool
from fxtrack.worker.protocol import JobSpec, Result, children_path, streamed_children

# The parent's tags a child window copies: what ran (device, versions, compile mode), so the
# child reads as the same configuration in the UI; its scenario's own besides (child_tags).
CHILD_TAGS = ("device", "framework_version", "python", "cuda", "cudnn", "compile_rule",
              "compile_mode", "compile_decision", "attention", "matmul_precision",
              "cpu_threads", "contended")

_LOADED: set[str] = set()  # tracking URIs whose MLflow client this process has opened
# result id -> the held fallback of a parent this process opened (hold_parent). Process-wide: a
# repeats sweep opens an aggregate in one cell's Job and closes it in another's (issue 60).
_HELD_PARENTS: dict[str, Path] = {}


@dataclasses.dataclass
class Tracker:
    """One job's way to its tracking store: ``uri`` (with credentials, as the writer needs it)
    and ``experiment``."""

    uri: str
    experiment: str

    def load(self) -> None:
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

    def hold(self, fallback: dict, job_dir: Path, config: dict,
             files: dict[str, str]) -> Path | None:
        """A run's ``fallback`` record (FAILED, saying why) in the spool while its worker runs
        (``spool.hold``): if this process is killed outright, ``fxtrack sync`` logs the
        worker's finished result, or the fallback, once (the worker stops with this process).
        Held again, the same entry is replaced (one per result id and process). None: the
        spool took nothing (said; the run goes on)."""
        try:
            return spool.hold(records.held_job(fallback, str(job_dir), config), files)
        except spool.SpoolError as e:  # the run goes on; only a kill would need the fallback
            print(f"fxtrack: no fallback for this run in the spool ({e})", file=sys.stderr)
            return None

    def log(self, record: dict, artifacts: dict) -> tuple[str | None, str]:
        """Spool ``record``, deliver it (directly if it cannot be spooled); (run id or None,
        where it went)."""
        from fxtrack.tracking import writer  # MLflow: loaded while the worker ran (load)

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

    def children(self, spec: JobSpec, config: dict, name: str) -> "Children":
        """The run's streamed children, held in the spool as the worker writes each."""
        return Children(self, spec, config, name)

    def log_children(self, spec: JobSpec, result: Result, config: dict, name: str,
                     kept: "Children | None" = None) -> None:
        """The run's windows (Result.children: scenario=serve's rate-search probes) as child
        runs of it, each with its own figures, verdict and per-request records; tagged with its
        scenario's ``probe_tag`` so the report counts them through their parent. Each was
        held in the spool as it ended (``kept``): logged now under the same result id, so a
        sync after a kill cannot log one twice."""
        copied = CHILD_TAGS + scenarios.get(spec.scenario).child_tags
        tags = {k: v for k, v in result.tags.items() if k in copied}
        for i, child in enumerate(result.children):
            result_id = kept.result_id(i) if kept is not None else uuid.uuid4().hex
            record, files = self.child_record(spec, child, tags, result.resolved, config,
                                              name, result_id)
            self.log(record, files)
        if kept is not None:
            kept.drop()

    def child_record(self, spec: JobSpec, child: dict, parent_tags: dict[str, str],
                     resolved: dict, config: dict, name: str, result_id: str
                     ) -> tuple[dict, dict[str, Path]]:
        """One streamed window (a serve probe) as a child run's record and files."""
        child_spec = dataclasses.replace(spec, result_id=result_id)
        tags = dict(parent_tags)
        tags.update(child["tags"], **{scenarios.get(spec.scenario).probe_tag: spec.result_id})
        # a window that ended is a finished run, whatever stopped its parent afterwards
        child_result = Result(result_id, status="FINISHED", metrics=dict(child["metrics"]),
                              series=dict(child["series"]), tags=tags, resolved=resolved)
        child_name = f"{name}-{child['suffix']}"
        now = int(time.time() * 1000)
        record = records.job_record(child_spec, child_result, config, self.uri, self.experiment,
                                    spec.result_id, child.get("start_time_ms") or now,
                                    child_name, records.summary_line(child_name, child_result))
        record["end_time_ms"] = child.get("end_time_ms") or now  # the window's own span
        files = {f"{role}.json": Path(path) for role, path in child["artifacts"].items()}
        return record, files


class Children:
    """A run's streamed children (``children.jsonl``: serve's probe windows), each held in
    the spool the moment the worker writes it: if this process is then killed outright,
    ``fxtrack sync`` logs every finished probe as a child of the run (issue 41 item 3)."""

    def __init__(self, tracker: Tracker, spec: JobSpec, config: dict, name: str) -> None:
        self.tracker, self.spec, self.config, self.name = tracker, spec, config, name
        self.path = children_path(spec.result_path)
        self.ids: list[str] = []
        self.held: list[Path] = []

    def result_id(self, index: int) -> str:
        while len(self.ids) <= index:
            self.ids.append(uuid.uuid4().hex)
        return self.ids[index]

    def keep(self) -> None:
        """Hold each child written since the last call (run_worker's ``while_running``)."""
        if not self.path.is_file():
            return
        streamed = streamed_children(self.spec.result_path)
        for i in range(len(self.held), len(streamed)):
            record, files = self.tracker.child_record(self.spec, streamed[i], {}, {}, self.config,
                                                      self.name, self.result_id(i))
            try:
                self.held.append(spool.hold(record, files))
            except spool.SpoolError as e:  # the run goes on; it logs its children at the end
                print(f"fxtrack: no fallback for the run's children in the spool ({e})",
                      file=sys.stderr)
                self.path = Path(os.devnull)  # not asked again: is_file() is False
                return

    def drop(self) -> None:
        for held in self.held:
            spool.drop(held)
        self.held = []
