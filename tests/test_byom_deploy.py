"""Deployment runtimes and int8 for a user's model (issue 30 item 3): the examples' models
exported through their framework's own exporter (torch's dynamo ONNX exporter, Keras'
ExportArchive + the TFLite converter), served, checked against the live model in eval mode on the
same inputs and timed; a combination without a path refused before any work with its reason.
In-process workers at tiny size (one framework import per framework for the whole file)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import job_spec, run_fxtrack

from fxtrack.scenarios import deploy

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
from byom import models  # noqa: E402

INFERENCE = dict(scenario="inference", runner="fxtrack.scenarios.inference.runner:run", steps=2,
                 warmup_steps=1, batch_size=4)


def serve(tmp_path, monkeypatch, framework, builder, runtime, quantize="none", **arch):
    from fxtrack.worker.__main__ import prepare_environment, run

    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    key = "keras" if framework == "tensorflow" else framework
    spec = job_spec(framework, "custom", tmp_path, arch={key: builder, **arch}, runtime=runtime,
                    quantize=quantize, **INFERENCE)
    prepare_environment(spec)
    return run(spec)


def assert_served(result, int8=False, params=None):
    assert result.status == "FINISHED", result.error
    assert result.guard == "ok", result.guard
    m = result.metrics
    bound = deploy.INT8_REL_ERR if int8 else deploy.FP32_REL_ERR
    assert 0 <= m["output_rel_err"] <= bound
    assert m["latency_ms_p50"] == m["step_time_ms_p50"] > 0
    assert m["throughput_samples_per_s"] > 0 and m["export_time_s"] > 0
    if params is not None:
        assert m["param_count"] == params


@pytest.mark.parametrize("framework,builder,runtime,quantize", [
    ("torch", "byom.models:build_torch", "onnxruntime", "none"),
    ("torch", "byom.models:build_torch", "native", "dynamic_int8"),
    ("tensorflow", "byom.models:build_keras", "tflite", "dynamic_int8"),
], ids=["torch-onnxruntime", "torch-native-int8", "tensorflow-tflite-int8"])
def test_the_byom_mlp_is_served_and_matches_the_live_model(tmp_path, monkeypatch, framework,
                                                           builder, runtime, quantize):
    result = serve(tmp_path, monkeypatch, framework, builder, runtime, quantize)
    assert_served(result, int8=quantize != "none", params=models.param_count())
    m = result.metrics
    assert result.tags["runtime"] == runtime and result.tags["quantize"] == quantize
    assert "top1_agreement" not in m  # a regression: the relative error bound alone
    assert m["output_rel_err"] > 0 if quantize != "none" else True  # int8 moved something
    assert result.tags["flops_source"]  # the framework's own counter, as scenario=inference
    if runtime != "native":
        assert Path(result.artifacts["model"]).stat().st_size > 0


@pytest.mark.parametrize("quantize", ["none", "dynamic_int8"])
def test_hf_gpt2_through_onnxruntime_with_top1_on_its_logits(tmp_path, monkeypatch, quantize):
    """A Hugging Face GPT-2 (keyword input_ids, a ModelOutput) through torch's ONNX exporter,
    fp32 and ONNX Runtime's dynamic int8: its logits compared with the live model's, top-1 over
    the vocabulary measured and held to the int8 rule (model.kind=lm)."""
    pytest.importorskip("transformers")
    result = serve(tmp_path, monkeypatch, "torch", "hf_gpt2:build_torch", "onnxruntime",
                   quantize, kind="lm",
                   kwargs={"seq_len": 8, "vocab": 64, "layers": 1, "hidden": 32})
    assert_served(result, int8=quantize != "none")
    if quantize == "none":
        assert result.metrics["top1_agreement"] == 1.0
    else:  # int8 moved the logits, within the bounds the guard holds it to
        assert 0 < result.metrics["output_rel_err"]
        assert result.metrics["top1_agreement"] >= deploy.INT8_TOP1
    assert result.metrics["tokens_per_s"] > 0


def test_kerashub_gpt2_through_tflite_int8_with_top1_on_its_logits(tmp_path, monkeypatch):
    """examples/kerashub_model.py's GPT-2 (dict inputs token_ids, padding_mask) through Keras'
    export and the TFLite converter at dynamic-range int8, held to the int8 rule on its logits."""
    pytest.importorskip("keras_hub")
    result = serve(tmp_path, monkeypatch, "tensorflow", "kerashub_model:build_keras", "tflite",
                   "dynamic_int8", kind="lm", kwargs={"seq_len": 8, "vocab": 64, "layers": 1})
    assert_served(result, int8=True)
    assert 0 < result.metrics["output_rel_err"]
    assert result.metrics["top1_agreement"] >= deploy.INT8_TOP1


def test_compare_outputs_holds_every_output_and_top1_only_for_scores():
    a, b = np.array([[1.0, 2.0, 3.0]], np.float32), np.array([10.0, 20.0], np.float32)
    ok = deploy.compare_outputs([a, b], [a, b + 0.5], int8=True, scores=False)
    assert ok[1] == "ok" and "top1_agreement" not in ok[0]
    assert deploy.compare_outputs([a, b], [a, b + 5.0], int8=True, scores=False)[1] != "ok"
    logits = np.array([[1.0, 1.01, 0.99]], np.float32)
    moved = np.array([[1.01, 1.0, 0.99]], np.float32)  # within 0.1 relative, top-1 moves
    metrics, guard = deploy.compare_outputs([logits], [moved], int8=True, scores=True)
    assert metrics["top1_agreement"] == 0.0 and "top-1" in guard
    assert deploy.compare_outputs([logits], [moved], int8=True, scores=False)[1] == "ok"
    assert "outputs" in deploy.compare_outputs([a, b], [a], int8=False, scores=False)[1]


def test_jax_refuses_a_users_runtime_before_any_work(tmp_path):
    proc = run_fxtrack(tmp_path, "framework=jax", "scenario=inference", "runtime=onnxruntime",
                       "model=custom", "model.jax=byom.models:build_jax", "hardware=cpu",
                       env={"PYTHONPATH": f"{ROOT / 'examples'}:{ROOT}"}, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "runtime=onnxruntime with model=custom is not supported by jax" in proc.stderr
    assert "[fxtrack] building" not in proc.stderr


def build_unconvertible(batch_size: int, seed: int):
    """The byom MLP followed by a custom op with no ONNX translation: torch.export captures it,
    the ONNX exporter cannot convert it."""
    import torch

    if not hasattr(torch.ops.fxtrack_test, "twice"):
        @torch.library.custom_op("fxtrack_test::twice", mutates_args=(),
                                 schema="(Tensor x) -> Tensor")
        def twice(x):
            return x * 2

        @twice.register_fake
        def _(x):
            return torch.empty_like(x)

    model, data, loss = models.build_torch(batch_size, seed)

    class Twice(torch.nn.Module):
        def forward(self, x):
            return torch.ops.fxtrack_test.twice(x)

    return torch.nn.Sequential(model, Twice()), data, loss


def test_an_op_the_exporter_cannot_convert_is_a_not_supported_cell_with_its_reason(
        tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    result = serve(tmp_path, monkeypatch, "torch", "test_byom_deploy:build_unconvertible",
                   "onnxruntime")
    assert result.status == "FAILED" and result.tags.get("unsupported") == "true", result.error
    assert "runtime=onnxruntime is not supported by torch" in result.error
    assert "ONNX exporter for model.torch=test_byom_deploy:build_unconvertible" in result.error
    assert "fxtrack_test" in result.error or "twice" in result.error  # the exporter's own line


def test_the_guard_fails_a_runtime_whose_outputs_differ(tmp_path, monkeypatch):
    """The guard reads the served outputs: a reference that no longer matches fails the run."""
    from fxtrack.frameworks.torch import deployment

    real = deployment.reference
    monkeypatch.setattr(deployment, "reference",
                        lambda backend: (lambda x, refs: (x, [r * 1.5 for r in refs]))(*real(backend)))
    result = serve(tmp_path, monkeypatch, "torch", "byom.models:build_torch", "onnxruntime")
    assert result.status == "FINISHED", result.error
    assert result.guard.startswith("output differs from native: relative error")
