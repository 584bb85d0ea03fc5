"""model.from_run: a converge run's logged model (its framework-neutral weights, tagged
``fxtrack.weights`` by ``artifacts.log_model``) found by the run's id, and its weights fetched
for a worker. MLflow is imported only when a config names such a run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fxtrack.environment import redact_uri_text
from fxtrack.tracking import target
from fxtrack.tracking.artifacts import WEIGHTS_TAG


class NoModel(ValueError):
    """model.from_run names no run, or a run without kept weights: one line saying which."""


def source(uri: str, run_id: str) -> dict[str, Any]:
    """The run ``run_id`` at ``uri`` and its logged model with weights: {run_id, run_name,
    params, tags, model_id, weights_uri}. Raises NoModel."""
    import mlflow
    from mlflow.tracking import MlflowClient

    db = target.sqlite_path(uri)
    if db is not None and not db.is_file():  # asking MLflow would create an empty store
        raise NoModel(f"model.from_run={run_id} names no run: there is no store at "
                      f"{redact_uri_text(uri)} (set tracking.uri to where the converge run went)")
    client = MlflowClient(uri)
    try:
        run = client.get_run(run_id)
    except mlflow.exceptions.MlflowException:
        raise NoModel(f"model.from_run={run_id} names no run at {redact_uri_text(uri)} (give a "
                      "scenario=converge run's id, as its run page shows it)") from None
    models = client.search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'")
    kept = [m for m in models if WEIGHTS_TAG in (m.tags or {})]
    if not kept:
        scenario = run.data.tags.get("fxtrack.scenario", "?")
        raise NoModel(f"model.from_run={run_id}: run {run.info.run_name!r} (scenario="
                      f"{scenario}) has no logged model with trained weights; only a "
                      "finished scenario=converge run keeps one")
    model = kept[0]
    return {"run_id": run_id, "run_name": run.info.run_name, "params": dict(run.data.params),
            "tags": dict(run.data.tags), "model_id": model.model_id,
            "weights_uri": f"{model.artifact_location.rstrip('/')}/{model.tags[WEIGHTS_TAG]}"}


def fetch(uri: str, found: dict[str, Any], directory: Path) -> Path:
    """The run's weights file, downloaded into ``directory`` (the job's, for its worker)."""
    import mlflow
    from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR

    directory.mkdir(parents=True, exist_ok=True)
    bar = os.environ.get(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name)
    os.environ[MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name] = "false"  # one small file: no bar
    try:
        return Path(mlflow.artifacts.download_artifacts(artifact_uri=found["weights_uri"],
                                                        dst_path=str(directory),
                                                        tracking_uri=uri))
    finally:
        if bar is None:
            os.environ.pop(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name, None)
        else:
            os.environ[MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name] = bar
