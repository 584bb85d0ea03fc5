"""The model=custom examples the docs show (docs/your-own-model.md), each run once at tiny size
from a directory outside the checkout: a Hugging Face GPT-2 on the PyTorch path (fp32, eager)
and a keras-hub GPT-2 backbone on the Keras path (framework=tensorflow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_fxtrack, seed_peak_cache

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TINY = ["batch_size=2", "steps=3", "warmup_steps=1", "hardware=cpu"]


def run_example(tmp_path: Path, *args: str) -> dict:
    env = {"PYTHONPATH": f"{EXAMPLES}:{EXAMPLES.parent}", **seed_peak_cache(tmp_path / "cache")}
    proc = run_fxtrack(tmp_path, "model=custom", *args, *TINY, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = tmp_path.glob("outputs/*/*/result.json")
    return json.loads(path.read_text())


def test_hf_gpt2_eager_fp32_on_torch(tmp_path):
    pytest.importorskip("transformers")  # the byom-examples extra
    result = run_example(tmp_path, "framework=torch", "model.torch=hf_gpt2:build_torch",
                         "framework.compile=false", "precision=fp32")
    assert result["status"] == "FINISHED" and result["guard"] == "ok"
    assert result["tags"]["compile_mode"] == "eager"
    assert result["tags"]["flops_source"] == "torch.utils.flop_counter"
    assert result["metrics"]["flops_per_sample"] > 0


def test_kerashub_gpt2_backbone_on_the_keras_path(tmp_path):
    pytest.importorskip("keras_hub")  # the byom-examples extra
    result = run_example(tmp_path, "framework=tensorflow",
                         "model.keras=kerashub_model:build_keras")
    assert result["status"] == "FINISHED" and result["guard"] == "ok"
    assert result["tags"]["flops_source"] == "tf.compat.v1.profiler"
    assert result["metrics"]["param_count"] > 0 and result["metrics"]["flops_per_sample"] > 0


@pytest.mark.slow
def test_kerashub_bert_with_dropout_on_tensorflow_and_keras(tmp_path):
    """Issue 30: a keras-hub BertBackbone with Dropout (its seed generator a variable every
    step assigns) FINISHES under framework=tensorflow and framework=keras, with one parameter
    count. Dropout's seed generator on each Keras backend is tests/test_byom_stateful.py's (a
    user's model on jax, torch and tensorflow): here keras-hub's own model, once per framework."""
    pytest.importorskip("keras_hub")
    results = {}
    for framework in ("tensorflow", "keras"):
        (tmp_path / framework).mkdir()
        results[framework] = run_example(tmp_path / framework, f"framework={framework}",
                                         "model.keras=kerashub_model:build_bert_keras")
        assert results[framework]["status"] == "FINISHED", results[framework]["error"]
    assert results["keras"]["tags"]["keras_backend"] == "jax"
    assert len({r["metrics"]["param_count"] for r in results.values()}) == 1, results


@pytest.mark.slow
def test_hf_gpt2_as_an_lm_and_through_checkpoint_on_torch(tmp_path):
    """Issue 30 items 2 and 6 on a real third-party model: tokens/s from its input_ids' length
    (a dict input), and its state_dicts restored exactly and torch.export matching the live
    model."""
    pytest.importorskip("transformers")
    (tmp_path / "lm").mkdir()
    result = run_example(tmp_path / "lm", "framework=torch", "model.torch=hf_gpt2:build_torch",
                         "model.kind=lm")
    m = result["metrics"]
    assert result["status"] == "FINISHED" and result["tags"]["seq_len"] == "32"
    assert m["tokens_per_s"] == pytest.approx(m["throughput_samples_per_s"] * 32)
    (tmp_path / "ckpt").mkdir()
    result = run_example(tmp_path / "ckpt", "framework=torch", "scenario=checkpoint",
                         "model.torch=hf_gpt2:build_torch")
    assert result["status"] == "FINISHED" and result["guard"] == "ok", result["guard"]
    assert result["metrics"]["checkpoint_restore_exact"] == 1.0
    assert result["metrics"]["export_max_rel_err"] <= 1e-4


@pytest.mark.slow
def test_kerashub_gpt2_through_checkpoint_on_tensorflow(tmp_path):
    """tf.train.Checkpoint restores the keras-hub GPT-2 exactly; its model.export SavedModel
    (dict inputs: token_ids, padding_mask) matches the live model."""
    pytest.importorskip("keras_hub")
    result = run_example(tmp_path, "framework=tensorflow", "scenario=checkpoint",
                         "model.keras=kerashub_model:build_keras")
    assert result["status"] == "FINISHED" and result["guard"] == "ok", result["guard"]
    assert result["metrics"]["checkpoint_restore_exact"] == 1.0
    assert result["metrics"]["export_max_rel_err"] <= 1e-4
