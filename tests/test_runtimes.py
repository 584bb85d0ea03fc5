"""Deployment runtimes (scenario=inference runtime=... quantize=...): each exported artefact is
served, checked against the native model on the same batch, and timed; combinations without a
path end as clear not-supported runs. Tiny models, one worker run each, in-process."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from fxtrack.scenarios import deploy
from fxtrack.worker.__main__ import prepare_environment, run

INFERENCE = dict(scenario="inference", runner="fxtrack.scenarios.inference.runner:run", steps=2,
                 warmup_steps=1)


def needs(*modules: str):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    # jax2onnx is its own extra: it pins orbax-checkpoint below the jax extra's (pyproject.toml)
    extra = "deploy-jax" if "jax2onnx" in missing else "deploy"
    return pytest.mark.skipif(bool(missing), reason=f"{missing} not installed: "
                              f"pip install 'fxtrack[{extra}]'")


def serve(spec_factory, framework, model, runtime, quantize="none", **kw):
    spec = spec_factory(framework, model, runtime=runtime, quantize=quantize, **INFERENCE, **kw)
    prepare_environment(spec)
    return run(spec)


def assert_served(result, int8=False):
    assert result.status == "FINISHED", result.error
    assert result.guard == "ok"
    m = result.metrics
    bound = deploy.INT8_REL_ERR if int8 else deploy.FP32_REL_ERR
    assert 0 <= m["output_rel_err"] <= bound and m["output_max_abs_err"] >= 0
    assert m["latency_ms_p50"] == m["step_time_ms_p50"] > 0
    assert m["throughput_samples_per_s"] > 0 and m["export_time_s"] > 0


def test_compare_fails_the_guard_outside_the_bound():
    ref = np.array([[1.0, 2.0, 3.0], [3.0, 1.0, 0.0]], np.float32)

    def compare(out, int8):  # logits: fxtrack's own models' one output, a score vector
        return deploy.compare_outputs([ref], [out], int8, scores=True)

    assert compare(ref + 1e-5, int8=False)[1] == "ok"
    metrics, guard = compare(ref + 0.01, int8=False)
    assert metrics["output_max_abs_err"] == pytest.approx(0.01) and "relative error" in guard
    swapped = ref[:, ::-1].copy()  # every top-1 changes
    assert compare(ref + 0.05, int8=True)[1] == "ok"  # within the int8 bound
    assert compare(swapped, int8=True)[1] != "ok"
    assert compare(np.full_like(ref, np.nan), int8=False)[1] != "ok"


@needs("onnxruntime", "onnx", "onnxscript")
def test_torch_onnxruntime_matches_native(spec_factory):
    result = serve(spec_factory, "torch", "resnet50", "onnxruntime")
    assert_served(result)
    assert result.tags["runtime"] == "onnxruntime" and result.metrics["artefact_mib"] > 0


@needs("onnxruntime", "onnx", "onnxscript")
def test_torch_onnxruntime_dynamic_int8_agrees_on_top1(spec_factory):
    result = serve(spec_factory, "torch", "bert", "onnxruntime", "dynamic_int8")
    assert_served(result, int8=True)
    assert result.metrics["top1_agreement"] >= deploy.INT8_TOP1


def test_torch_native_dynamic_int8(spec_factory):
    assert_served(serve(spec_factory, "torch", "bert", "native", "dynamic_int8"), int8=True)


@needs("openvino", "onnx", "onnxscript")
def test_openvino_serves_the_onnx_export(spec_factory):
    assert_served(serve(spec_factory, "torch", "bert", "openvino"))


@needs("ai_edge_litert")
@pytest.mark.parametrize("quantize", ["none", "dynamic_int8"])
def test_tensorflow_tflite(spec_factory, quantize):
    result = serve(spec_factory, "tensorflow", "bert", "tflite", quantize)
    assert_served(result, int8=quantize != "none")
    fp32_mib = result.metrics["param_count"] * 4 / 2**20  # every weight as float32
    # dynamic range int8 stores the weights in a byte: about a quarter of the fp32 file
    assert (result.metrics["artefact_mib"] < 0.5 * fp32_mib) == (quantize == "dynamic_int8")


@needs("onnxruntime", "jax2onnx")
def test_jax_onnxruntime_through_jax2onnx(spec_factory):
    assert_served(serve(spec_factory, "jax", "bert", "onnxruntime"))


@pytest.mark.parametrize("framework, runtime, quantize, says", [
    ("torch", "tflite", "none", "runtime=tflite is not supported by torch"),
    ("tensorflow", "native", "dynamic_int8", "use runtime=tflite"),
    ("jax", "native", "dynamic_int8", "is not supported by jax"),
    ("torch", "tensorrt", "dynamic_int8", "TensorRT's int8 is static"),
])
def test_combinations_without_a_path_are_clear_unsupported_runs(spec_factory, framework, runtime,
                                                                quantize, says):
    result = serve(spec_factory, framework, "bert", runtime, quantize)
    assert result.status == "FAILED" and says in result.error
    assert result.tags["unsupported"] == "true"
    assert result.resolved["device_kind"] == "cpu"  # filed with the runs of its hardware


def test_tensorrt_on_a_cpu_says_it_needs_a_gpu(spec_factory):
    result = serve(spec_factory, "torch", "bert", "tensorrt")
    assert result.status == "FAILED" and "needs an NVIDIA GPU" in result.error


def _run(framework, runtime="native", quantize="none", status="FINISHED", t=0, error=None,
         **metrics):
    row = {"run_id": f"{framework}{runtime}{quantize}{t}", "status": status, "start_time": t,
           "tags.fxtrack.framework": framework, "tags.fxtrack.model": "resnet50",
           "tags.fxtrack.scenario": "inference", "tags.fxtrack.precision": "fp32",
           "tags.fxtrack.devices": "1", "tags.fxtrack.hardware": "cpu",
           "params.runtime": runtime, "params.quantize": quantize}
    if error:
        row["tags.fxtrack.error"] = error
    row.update({f"metrics.{k}": v for k, v in metrics.items()})
    return row


def test_deployment_table_shows_speedup_error_and_unsupported_cells():
    import pandas as pd

    from fxtrack.report import levers

    frame = pd.DataFrame([
        _run("torch", latency_ms_p50=20.0, t=1),
        _run("torch", "onnxruntime", latency_ms_p50=40.0, t=2),  # superseded by the next one
        _run("torch", "onnxruntime", latency_ms_p50=10.0, output_rel_err=2e-6, top1_agreement=1.0,
             artefact_mib=97.6, t=3),
        _run("torch", "tflite", status="FAILED", t=4,
             error="NotImplementedError: runtime=tflite is not supported by torch 2.13: use onnx"),
        _run("tensorflow", "native", "dynamic_int8", status="FAILED", t=5,
             error="RuntimeError: out of memory"),
    ])
    (table,) = levers.deployment(frame)
    rows = {(r[1], r[2], r[3]): r for r in table.rows}
    assert rows[("torch", "onnxruntime", "none")][4:] == ["10.0", "2.00x", "2.0e-06", "100%", "97.6"]
    assert rows[("torch", "tflite", "none")][4].startswith("not supported by torch 2.13")
    assert rows[("tensorflow", "native", "dynamic_int8")][4].startswith("FAILED: RuntimeError")
    assert levers.memory(frame) == []  # no training runs with levers


def test_int8_runs_get_no_mfu_against_the_float_peak(spec_factory, monkeypatch):
    """An int8 run's arithmetic is not the float peak's: MFU would read above 100% (measured:
    185% for dynamic_int8 BERT on CPU). Float runs still get theirs."""
    from types import SimpleNamespace

    from fxtrack.worker.protocol import Result
    from fxtrack.orchestrator import calibration
    from fxtrack.orchestrator.job import enrich

    monkeypatch.setattr(calibration, "mfu_metrics", lambda *a, **k: ({"mfu": 0.5}, {}))
    conf = SimpleNamespace(framework=SimpleNamespace(python=None),
                           hardware=SimpleNamespace(price_per_hour=None))
    for quantize, has_mfu in (("none", True), ("dynamic_int8", False)):
        spec = spec_factory("torch", "bert", scenario="inference", runtime="onnxruntime",
                            quantize=quantize)
        result = Result(spec.result_id)
        result.metrics["achieved_tflops"] = 0.4
        enrich(result, spec, conf)
        assert ("mfu" in result.metrics) is has_mfu
        assert result.metrics["achieved_tflops"] == 0.4


@needs("onnxruntime", "onnx")
def test_dynamic_int8_of_a_model_with_external_weights(tmp_path):
    """jax2onnx keeps BERT's weights in a model.onnx.data file beside the graph; ONNX Runtime's
    quantiser re-saved the model without it and failed (canonical BERT, measured), and the
    artefact size counted the graph alone (0.7 MiB). The weights are inlined before quantising,
    counted in the size, and the int8 model answers like the float one."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from fxtrack.runtimes import onnxruntime as ort_runtime

    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])],
        [numpy_helper.from_array(w, "w")])
    src = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(src),
              save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    data = tmp_path / "model.onnx.data"
    assert data.exists()
    # the artefact's size counts the weights beside the graph
    assert deploy.artefact_bytes(src) == src.stat().st_size + data.stat().st_size
    assert deploy.artefact_bytes(src) >= w.nbytes
    dst = ort_runtime.quantize_dynamic(src, tmp_path / "model.int8.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "model.int8.onnx", "model.onnx", "model.onnx.data"]  # the inlined copy is gone
    x = rng.standard_normal((4, 64)).astype(np.float32)
    (got,) = ort_runtime.load(dst, "cpu")({"x": x})
    assert np.abs(got - x @ w).max() <= 0.05 * np.abs(x @ w).max()
