"""Accuracy at serving precision: a tiny torch converge run keeps its trained model as an MLflow
logged model, and scenario=inference model.from_run=<run id> scores that model on the run's
held-out split per runtime and quantize; bad model.from_run input is one line before any work."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from fxtrack.config.validate import ConfigError
from tests.conftest import run_fxtrack, seed_peak_cache
from tests.test_config import composed
from tests.test_converge import CONVERGE, tiny_images

ORT = all(importlib.util.find_spec(m) for m in ("onnx", "onnxruntime", "onnxscript"))


def runs_of(client, scenario: str) -> list:
    return client.search_runs([e.experiment_id for e in client.search_experiments()],
                              f"tags.`fxtrack.scenario` = '{scenario}'")


@pytest.fixture(scope="module")
def converged(tmp_path_factory):
    """One torch converge run on a tiny data=file set to an easy target, then one inference
    sweep from it: runtime=native, and with ONNX Runtime installed onnxruntime and dynamic int8."""
    import mlflow

    cwd = tmp_path_factory.mktemp("from_run")
    env = seed_peak_cache(cwd / "cache")
    path = tiny_images(cwd / "d.npz", n=200)
    done = run_fxtrack(cwd, *CONVERGE, "framework=torch", "data=file", f"data.path={path}",
                       "model.patch=4", "batch_size=16", "scenario.metric=accuracy",
                       "scenario.target=0.6", "scenario.max_epochs=2", "scenario.eval_every=2",
                       "scenario.lr=1e-2", env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{cwd}/mlflow.db")
    (run,) = runs_of(client, "converge")
    levers = ("runtime=native,onnxruntime", "quantize=none,dynamic_int8") if ORT else ()
    done = run_fxtrack(cwd, "-m", "scenario=inference", "model=vit",
                       f"model.from_run={run.info.run_id}", "framework=torch", *levers,
                       env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {(r.data.tags["fxtrack.runtime"], r.data.tags["fxtrack.quantize"]): r
            for r in runs_of(client, "inference")}
    done = run_fxtrack(cwd, "scenario=serve", "model=vit", f"model.from_run={run.info.run_id}",
                       "framework=torch", "scenario.rate=40", "scenario.num_requests=8",
                       "scenario.max_batch=2", "scenario.batch_buckets=[1,2]", env=env,
                       timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (rows["serve"],) = runs_of(client, "serve")
    return client, run, rows, cwd


@pytest.mark.slow
def test_a_converge_run_logs_its_trained_model(converged):
    client, run, _, _ = converged
    (model,) = client.search_logged_models([run.info.experiment_id],
                                           f"source_run_id = '{run.info.run_id}'")
    assert model.name == "model"
    assert model.tags["fxtrack.weights"] == "weights.npz"
    files = {a.path for a in client.list_logged_model_artifacts(model.model_id)}
    assert "weights.npz" in files
    if ORT:  # torch exports ONNX: the same logged model has the mlflow.onnx flavour
        assert {"model.onnx", "MLmodel"} <= files


def test_an_onnx_model_is_logged_with_its_flavours_requirements_not_inferred(tmp_path,
                                                                          monkeypatch):
    """The ONNX logged model's requirements are mlflow.onnx's own: MLflow's inference (the
    model loaded in a Python process of its own) is never asked for them."""
    onnx = pytest.importorskip("onnx")
    import mlflow
    from mlflow.utils import requirements_utils

    from fxtrack.tracking import artifacts

    def inferred(*args, **kwargs):
        raise AssertionError("MLflow inferred the requirements in a process of its own")

    monkeypatch.setattr(requirements_utils, "_infer_requirements", inferred)
    value = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "g",
                                   [value], [onnx.helper.make_tensor_value_info(
                                       "y", onnx.TensorProto.FLOAT, [1])])
    path = tmp_path / "model.onnx"
    onnx.save(onnx.helper.make_model(graph), str(path))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    exp_id = client.create_experiment("x")
    run_id = client.create_run(exp_id).info.run_id
    artifacts.log_model(uri, exp_id, run_id, path)
    (model,) = client.search_logged_models([exp_id])
    got = mlflow.artifacts.download_artifacts(f"{model.artifact_location}/requirements.txt",
                                              dst_path=str(tmp_path / "got"), tracking_uri=uri)
    lines = [line for line in Path(got).read_text().splitlines()
             if not line.startswith("mlflow")]
    assert lines == mlflow.onnx.get_default_pip_requirements()


@pytest.mark.slow
def test_inference_from_run_scores_the_converged_model_per_runtime(converged):
    """The native fp32 row reproduces the converge run's last held-out accuracy (same weights,
    same split); every row logs accuracy_vs_fp32 against the native model of its own job."""
    _, run, rows, _ = converged
    final = run.data.metrics["final_eval_accuracy"]
    native = rows[("native", "none")]
    m, tags = native.data.metrics, native.data.tags
    assert m["eval_accuracy"] == pytest.approx(final, abs=1e-9)
    assert m["accuracy_vs_fp32"] == 1.0 and tags["fxtrack.serving_quality"] == "kept"
    assert native.data.params["model.from_run"] == run.info.run_id
    assert native.info.run_name.endswith(f"from_{run.info.run_id[:8]}")
    assert native.data.params["data.name"] == "file"  # the run's data, not the command line's
    digest = {i.dataset.digest for r in (run, native) for i in r.inputs.dataset_inputs}
    assert len(digest) == 1  # the same split, logged as the same dataset
    # rebuilt at the run's dims and the data's shape (8 x 8 images, 3 classes)
    assert "-layers1-hidden16-" in native.info.run_name
    assert "image_size8" in native.info.run_name and "num_classes3" in native.info.run_name
    if not ORT:
        pytest.skip("onnx, onnxruntime, onnxscript not installed: the native row only")
    assert set(rows) == {("native", "none"), ("native", "dynamic_int8"),
                         ("onnxruntime", "none"), ("onnxruntime", "dynamic_int8"), "serve"}
    for key, row in rows.items():
        m = row.data.metrics
        assert 0.0 <= m["eval_accuracy"] <= 1.0, key
        ratio = m["accuracy_vs_fp32"]
        assert ratio == pytest.approx(m["eval_accuracy"] / final), key  # fp32 reference = final
        assert row.data.tags["fxtrack.serving_quality"] == ("kept" if ratio >= 0.99 else "lost")
    assert rows[("onnxruntime", "none")].data.metrics["accuracy_vs_fp32"] == 1.0


@pytest.mark.slow
def test_serve_from_run_serves_the_trained_weights_and_scores_them(converged):
    """scenario=serve loads the run's weights before it serves (a seeded model would score
    about chance, 1/3 here, not the run's accuracy) and scores the model it served."""
    _, run, rows, _ = converged
    serve = rows["serve"]
    m, tags = serve.data.metrics, serve.data.tags
    assert m["eval_accuracy"] == pytest.approx(run.data.metrics["final_eval_accuracy"], abs=1e-9)
    assert m["accuracy_vs_fp32"] == 1.0 and tags["fxtrack.serving_quality"] == "kept"
    assert serve.data.params["model.from_run"] == run.info.run_id
    assert m["request_throughput_rps"] > 0 and "serve_e2e_ms_p99" in m  # it served


def refusal(uri: str, *overrides: str) -> str:
    from fxtrack.orchestrator import from_run

    with pytest.raises(ConfigError) as e:
        from_run.apply(composed(*overrides), uri)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.slow
def test_bad_from_run_is_refused_in_one_line_before_any_work(converged, tmp_path):
    client, run, rows, cwd = converged
    uri = f"sqlite:///{cwd}/mlflow.db"
    good = (f"model.from_run={run.info.run_id}", "scenario=inference")
    assert "names no run at" in refusal(uri, "model.from_run=0123abcd", "scenario=inference")
    assert "there is no store at" in refusal(f"sqlite:///{tmp_path}/none.db", *good)
    seeded = rows[("native", "none")].info.run_id  # an inference run: it kept no weights
    assert "has no logged model with trained weights" in refusal(
        uri, f"model.from_run={seeded}", "scenario=inference")
    assert "trained model=vit, another family than model=bert" in refusal(uri, *good,
                                                                            "model=bert")
    assert "read by scenario=inference" in refusal(uri, *good[:1], "scenario=train")
    assert "read by scenario=inference/serve" in refusal(uri, *good[:1], "scenario=generate")
    assert "evaluates at precision=fp32" in refusal(uri, *good, "precision=bf16")
    before = len(client.search_runs([run.info.experiment_id]))
    done = run_fxtrack(cwd, "scenario=inference", "model.from_run=0123abcd", timeout=300)
    assert done.returncode == 2 and "names no run at" in done.stderr
    assert len(client.search_runs([run.info.experiment_id])) == before  # nothing was run


def test_saved_weights_load_back_by_name_and_shape(tmp_path):
    """The weights file is the shared start's form: loaded by name, its shape checked."""
    from fxtrack.frameworks import initial

    saved = {"blocks.0.attn.qkv.weight": np.arange(6, dtype=np.float32).reshape(3, 2)}
    value = initial.loaded(initial.save(tmp_path / initial.WEIGHTS_FILE, saved))
    assert (value("blocks.0.attn.qkv.weight", (3, 2), seed=7) == saved[
        "blocks.0.attn.qkv.weight"]).all()
    with pytest.raises(ValueError, match="no parameter 'head.weight'"):
        value("head.weight", (3, 2), 0)
    with pytest.raises(ValueError, match=r"is \(3, 2\), the model's \(2, 3\)"):
        value("blocks.0.attn.qkv.weight", (2, 3), 0)
