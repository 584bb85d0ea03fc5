"""How runs read in the MLflow UI, against a real ``mlflow server`` on loopback (its REST API
through MlflowClient): the experiment kind, run names that tell configs apart, notes, resolved
params, dataset inputs, the sweep parent's verdict note, code size and report files, a
deployment run's logged ONNX model, and ``fxtrack report`` keeping out of the benchmark
experiment. One tiny sweep (batch_size=2,4) and one tiny deployment run, shared by the tests."""

from __future__ import annotations

import importlib.util
import json

import pytest

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("torch")

from conftest import run_fxtrack, seed_peak_cache  # noqa: E402
from servers import MlflowServer  # noqa: E402

TINY = ["framework=torch", "model=vit", "size=tiny", "steps=2", "warmup_steps=1",
        "hardware=cpu"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = MlflowServer(tmp_path_factory.mktemp("ui-server")).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def sweep(server, tmp_path_factory):
    """A two-config sweep (batch_size=2,4) logged to the server; returns (client, experiment,
    runs by name, the parent run)."""
    cwd = tmp_path_factory.mktemp("ui-sweep")
    env = seed_peak_cache(cwd / "cache")
    proc = run_fxtrack(cwd, "-m", *TINY, "batch_size=2,4", f"tracking.uri={server.url}", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = mlflow.MlflowClient(server.url)
    exp = client.get_experiment_by_name("fxtrack")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if "fxtrack.sweep" in r.data.tags]
    children = {r.info.run_name: r for r in runs if r.data.tags.get("fxtrack.framework")}
    return client, exp, children, parent


def test_experiment_is_a_model_training_one(sweep):
    _, exp, _, _ = sweep
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"


def test_existing_experiment_without_the_kind_gets_it(tmp_path):
    from fxtrack.tracking import runs

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = runs.client_for(uri)
    exp_id = client.create_experiment("made-by-hand")
    runs.experiment_id(client, "made-by-hand", uri)
    assert client.get_experiment(exp_id).tags["mlflow.experimentKind"] == "custom_model_development"


def test_sweep_configs_have_distinct_names_that_say_what_differs(sweep):
    _, _, children, parent = sweep
    assert set(children) == {"torch-vit-train-fp32-x1-tiny-b2-s2",
                             "torch-vit-train-fp32-x1-tiny-b4-s2"}
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id
               for c in children.values())


def test_every_run_has_its_summary_as_note(sweep):
    _, _, children, _ = sweep
    for name, run in children.items():
        note = run.data.tags["mlflow.note.content"]
        assert note.startswith(f"{name}: ") and "samples/s" in note and "step p50" in note


def test_params_hold_resolved_values_and_no_module_paths(sweep):
    _, _, children, _ = sweep
    params = children["torch-vit-train-fp32-x1-tiny-b2-s2"].data.params
    assert params["hardware.name"] == "cpu" and params["batch_size"] == "2"
    assert params["framework.compile"] in ("true", "false")  # what ran, not "auto"
    assert int(params["hardware.cpu_threads"]) >= 1
    assert not {k for k, v in params.items() if v in ("auto", "None")}
    assert "tracking.uri" in params  # set here, so logged (redacted)
    assert not {"framework.package", "scenario.runner", "hardware.coordinator"} & set(params)


def test_dataset_input_names_shapes_dtypes_and_seed(sweep):
    client, _, children, _ = sweep
    run = client.get_run(children["torch-vit-train-fp32-x1-tiny-b4-s2"].info.run_id)
    (inp,) = run.inputs.dataset_inputs
    assert inp.dataset.name == "synthetic-vit" and inp.dataset.digest.startswith("seed0-4x32x32x3")
    features = json.loads(json.loads(inp.dataset.schema)["mlflow_tensorspec"]["features"])
    assert {f["name"]: f["tensor-spec"]["dtype"] for f in features} == {
        "images": "float32", "labels": "int32"}
    assert {t.key: t.value for t in inp.tags}["mlflow.data.context"] == "training"


def test_code_size_is_on_the_parent_not_on_the_runs(sweep):
    client, _, children, parent = sweep
    for run in children.values():
        assert not [k for k in run.data.metrics if k.startswith("code_")]
    assert int(parent.data.params["code_sloc.torch"]) > 0
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert "code_size.csv" in artifacts


def test_parent_has_the_verdict_table_as_note_and_the_report_files(sweep):
    client, _, children, parent = sweep
    note = parent.data.tags["mlflow.note.content"]
    assert "Jobs:" in note and all(name in note for name in children)
    report = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/index.html", "report/report.html", "report/report.csv", "report/report.md"} <= report
    assert any(p.endswith(".png") for p in report)


def test_report_adds_no_run_to_the_benchmark_experiment(sweep, server, tmp_path):
    client, exp, _, _ = sweep
    before = {r.info.run_id for r in client.search_runs([exp.experiment_id])}
    proc = run_fxtrack(tmp_path, "report", "--uri", server.url, "--out", str(tmp_path / "r"),
                       "--log")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {r.info.run_id for r in client.search_runs([exp.experiment_id])} == before
    reports = client.get_experiment_by_name("fxtrack-reports")
    assert len(client.search_runs([reports.experiment_id])) == 1


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("onnx", "onnxruntime",
                                                                 "onnxscript")),
                    reason="needs onnx, onnxruntime, onnxscript")
def test_deployment_run_logs_its_onnx_model_with_latency(server, tmp_path, monkeypatch):
    env = seed_peak_cache(tmp_path / "cache")
    proc = run_fxtrack(tmp_path, *TINY, "batch_size=2", "scenario=inference",
                       "runtime=onnxruntime", "tracking.experiment=fxtrack-deploy",
                       f"tracking.uri={server.url}", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = mlflow.MlflowClient(server.url)
    exp = client.get_experiment_by_name("fxtrack-deploy")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == "torch-vit-inference-fp32-x1-tiny-b2-s2-onnxruntime"
    (model,) = client.search_logged_models([exp.experiment_id])
    assert model.source_run_id == run.info.run_id and model.name == "model"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)  # where models:/ URIs resolve
    assert "onnx" in mlflow.models.get_model_info(model.model_uri).flavors
    assert any(m.key == "latency_ms_p50" for m in model.metrics or [])
