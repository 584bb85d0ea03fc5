"""A spooled record as what MLflow takes (params, tags, metrics, dataset inputs, artifact
files), checked before anything reaches the server: an entry that cannot be logged is found
out here, set aside, and never fails half-way through a run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, NamedTuple

import mlflow
from mlflow.entities import Metric, Param, RunStatus, RunTag

from fxtrack.tracking import spool
from fxtrack.tracking.errors import EntryInvalid, first_line

class Payload(NamedTuple):
    """What a record sends, checked and converted before anything reaches the server."""
    params: list[Param]
    tags: list[RunTag]
    metrics: list[Metric]
    files: list[tuple[str, Path | str]]  # artifact name -> file to upload, or its text
    inputs: tuple = ()  # mlflow.entities.DatasetInput: what the run read


_REQUIRED = ("kind", "result_id", "run_name", "status")


def prepare(record: dict[str, Any], files: list[tuple[str, Path | str]]) -> Payload:
    """The record's params, tags, metrics and artifacts as MLflow takes them. Raises
    EntryInvalid (the entry's own fault: no retry can help) for a missing field, a value that
    is no number, a name MLflow refuses, an artifact that cannot be read."""
    missing = [key for key in _REQUIRED if not record.get(key)]
    if not (record.get("experiment") or record.get("experiment_id") or record.get("adopt_run_id")):
        missing.append("experiment")
    if missing:
        raise EntryInvalid(f"the record has no {', '.join(missing)}")
    if record["kind"] not in ("job", "sweep"):
        raise EntryInvalid(f"the record's kind {record['kind']!r} is neither 'job' nor 'sweep'")
    try:
        RunStatus.from_string(record["status"])
    except Exception:  # noqa: BLE001 - MLflow raises a bare Exception for an unknown status
        raise EntryInvalid(f"the record's status {record['status']!r} is not an MLflow run "
                           "status") from None
    end = record.get("end_time_ms") or int(time.time() * 1000)
    try:
        params = [Param(str(k), str(v)[:6000]) for k, v in (record.get("params") or {}).items()]
        tags = [RunTag(str(k), str(v)[:5000]) for k, v in (record.get("tags") or {}).items()]
        metrics = [Metric(str(k), _number(k, v), int(end), 0)
                   for k, v in (record.get("metrics") or {}).items()]
        times = record.get("series_times_ms") or {}
        chosen = record.get("series_steps") or {}
        for key, values in (record.get("series") or {}).items():
            stamps = times.get(key) or [end] * len(values)
            steps = chosen.get(key) or range(len(values))
            metrics += [Metric(str(key), _number(key, v), int(t), int(i))
                        for v, t, i in zip(values, stamps, steps)]
    except (AttributeError, TypeError, ValueError) as e:
        raise EntryInvalid(f"the record is malformed ({type(e).__name__}: {e})") from None
    _check_names(params, tags, metrics)
    inputs = _datasets(record.get("inputs") or [])
    readable: list[tuple[str, Path | str]] = []
    for name, content in files:
        try:
            if isinstance(content, Path) and content.is_file():
                with open(content, "rb") as f:
                    f.read(1)
            elif isinstance(content, Path) and not content.is_dir():
                continue  # a file the run never wrote (spool.write skips it too)
        except OSError as e:
            raise EntryInvalid(f"artifact {name} cannot be read ({type(e).__name__}: "
                               f"{e.strerror or e})") from None
        readable.append((name, content))
    return Payload(params, tags, metrics, readable, tuple(inputs))


def _datasets(inputs: list[dict[str, Any]]) -> list:
    """The record's ``inputs`` (records.dataset_input) as MLflow's dataset inputs, the context
    (training | inference) as MLflow's own input tag."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    try:
        return [DatasetInput(Dataset(d["name"], d["digest"], d["source_type"], d["source"],
                                     d.get("schema"), d.get("profile")),
                             [InputTag(MLFLOW_DATASET_CONTEXT, d["context"])] if d.get("context")
                             else []) for d in inputs]
    except (KeyError, TypeError) as e:
        raise EntryInvalid(f"the record's inputs are malformed ({type(e).__name__}: {e})") from None


def _number(key: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise EntryInvalid(f"metric {key!r} is not a number: {value!r:.80}") from None


def _check_names(params: list[Param], tags: list[RunTag], metrics: list[Metric]) -> None:
    """MLflow's own name rules, applied here so that a bad name sets the entry aside instead of
    failing half-way through a run on the server."""
    from mlflow.utils import validation

    try:
        for p in params:
            validation._validate_param_name(p.key)
        for t in tags:
            validation._validate_tag_name(t.key)
        for m in {m.key for m in metrics}:
            validation._validate_metric_name(m)
    except mlflow.exceptions.MlflowException as e:
        raise EntryInvalid(f"MLflow refuses a name in the record: {first_line(e)}") from None


def load_entry(entry: Path) -> tuple[dict[str, Any], list[tuple[str, Path | str]]]:
    """A claimed entry's record and artifact files; EntryInvalid if they cannot be read."""
    try:
        return spool.load(entry), list(spool.artifacts(entry))
    except (OSError, ValueError, AttributeError) as e:
        raise EntryInvalid(f"unreadable entry: {type(e).__name__}: {e}") from None
