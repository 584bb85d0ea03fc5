"""A run's files: each artifact uploaded once, straight to the run's artifact location; a
deployment run's ONNX model logged as an MLflow logged model; a replaced run's files deleted
with it."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

from mlflow.tracking import MlflowClient

# The logged model's tag naming its framework-neutral weights file (a converge run's; read back
# by model.from_run, fxtrack.tracking.models)
WEIGHTS_TAG = "fxtrack.weights"


def model_files(record: dict[str, Any], files: list[tuple[str, Path | str]]):
    """(the artifacts less the logged model's folder, the model file in it, the converge
    weights file in it). The model file is None where there is none or its flavour is not in
    MLflow; without weights too, the folder goes up as a plain artifact."""
    spec = record.get("logged_model")
    if not spec:
        return files, None, None
    folder = dict(files).get(spec["artifact"])
    if not isinstance(folder, Path):
        return files, None, None
    model = folder / spec["file"] if spec.get("flavor") else None
    model = model if model is not None and model.is_file() else None
    weights = folder / spec["weights"] if spec.get("weights") else None
    weights = weights if weights is not None and weights.is_file() else None
    if model is None and weights is None:
        return files, None, None
    return [f for f in files if f[0] != spec["artifact"]], model, weights


def log_model(uri: str, exp_id: str, run_id: str, path: Optional[Path],
              weights: Optional[Path] = None) -> None:
    """Log a run's model as an MLflow logged model of the run, so the run's Models tab lists it
    with the run's metrics (latency included): a deployment run's ONNX artefact through
    ``mlflow.onnx`` (records.MODEL_FLAVORS), and a converge run's trained weights
    (``weights``, tagged ``fxtrack.weights``: what ``model.from_run`` loads) in the same logged
    model, or in one of their own where the framework exported no ONNX. MLflow's model API
    logs through the global tracking URI and puts the model in the active experiment: both
    pointed at this run's for this call only."""
    import mlflow.onnx
    from mlflow.entities import LoggedModelStatus
    from mlflow.models import Model

    previous = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    previous_exp = os.environ.get("MLFLOW_EXPERIMENT_ID")
    mlflow.set_tracking_uri(uri)
    os.environ["MLFLOW_EXPERIMENT_ID"] = exp_id
    try:
        if path is not None:
            import onnx

            # The flavour's own requirements: MLflow otherwise infers them by loading the
            # model in a Python process of its own, 2 s of CPU per logged model.
            model_id = Model.log(artifact_path=None, name="model", flavor=mlflow.onnx,
                                 run_id=run_id, onnx_model=onnx.load(str(path)),  # its external
                                 pip_requirements=mlflow.onnx.get_default_pip_requirements(),
                                 ).model_id  # data, beside it, too
        if weights is not None:
            client = MlflowClient(uri)
            if path is None:
                model_id = client.create_logged_model(exp_id, name="model",
                                                      source_run_id=run_id).model_id
            client.log_model_artifact(model_id, str(weights))
            client.set_logged_model_tags(model_id, {WEIGHTS_TAG: weights.name})
            if path is None:
                client.finalize_logged_model(model_id, LoggedModelStatus.READY)
    finally:
        if previous:
            mlflow.set_tracking_uri(previous)
        if previous_exp is None:
            os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
        else:
            os.environ["MLFLOW_EXPERIMENT_ID"] = previous_exp


def upload(client: MlflowClient, run_id: str, uri: str, artifact_uri: Optional[str],
            files: list[tuple[str, Path | str]]) -> None:
    """Each artifact once, straight to the run's artifact location (no get_run per file);
    texts and renamed files go through a temporary directory."""
    if not files:
        return
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    repo = get_artifact_repository(artifact_uri, tracking_uri=uri) if artifact_uri else None
    tmp: Optional[Path] = None
    try:
        for name, content in files:
            if not (isinstance(content, Path) and content.name == name):
                tmp = tmp or Path(tempfile.mkdtemp(prefix="fxtrack-upload-"))
                path = tmp / name
                if isinstance(content, Path):
                    shutil.copyfile(content, path)
                else:
                    path.write_text(content)
                content = path
            if repo is None and content.is_dir():
                client.log_artifacts(run_id, str(content), name)
            elif repo is None:
                client.log_artifact(run_id, str(content))
            elif content.is_dir():
                repo.log_artifacts(str(content), name)
            else:
                repo.log_artifact(str(content))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def discard(client: MlflowClient, uri: str, run_id: str, artifact_uri: Optional[str]) -> None:
    """Delete a run and its artifacts (MLflow's delete_run keeps them until `mlflow gc`)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    try:
        if artifact_uri:
            get_artifact_repository(artifact_uri, tracking_uri=uri).delete_artifacts()
    except Exception:  # noqa: BLE001, S110 - a leftover folder costs disk space, never a result
        pass
    client.delete_run(run_id)
