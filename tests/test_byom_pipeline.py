"""scenario=pipeline for a user's model (issue 30 item 5): the builder's own (inputs, targets)
written in each framework's record format (``.npy`` for the torch DataLoader, TFRecord for
tf.data, ArrayRecord for Grain), read back through that framework's loader and trained with
scenario=train's step. Through the real CLI at tiny size: the examples/byom MLP in one sweep
(keras, which has no pipeline, refused before any work), and a Hugging Face GPT-2 (a dict
input, model.kind=lm) on torch. The records are read back here and compared with the
builder's batch."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import run_fxtrack, seed_peak_cache

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))
from byom import models  # noqa: E402  (the builders' data, framework-free)

BATCH, SAMPLES = 4, 12  # 12 records: the builder's 4 samples three times
TINY = [f"batch_size={BATCH}", "steps=3", "warmup_steps=1", "hardware=cpu",
        "scenario=pipeline", f"scenario.dataset_samples={SAMPLES}",
        "scenario.loader_workers=1"]
FORMATS = {"torch": "npy", "tensorflow": "tfrecord", "jax": "array_record"}


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": f"{EXAMPLES}:{ROOT}", "FXTRACK_MEMORY_GIB": "off",
           **seed_peak_cache(cwd / "cache")}
    proc = run_fxtrack(cwd, *args, "model=custom", *TINY, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def records(cwd: Path, form: str) -> tuple[dict, list[np.ndarray]]:
    """The manifest and every array of the one cached dataset in record format ``form``, read
    here with the format's own reader (not fxtrack's loaders)."""
    (directory,) = (cwd / "cache" / "datasets").glob(f"user-{form}-*")
    assert (directory / "complete").exists()
    manifest = json.loads((directory / "records.json").read_text())
    leaves = manifest["leaves"]
    if form == "npy":
        return manifest, [np.load(directory / f"leaf-{i}.npy") for i in range(len(leaves))]
    if form == "array_record":
        import grain

        source = grain.sources.ArrayRecordDataSource([str(directory / "records.array_record")])
        rows = [source[i] for i in range(len(source))]
        out, at = [], 0
        for leaf in leaves:
            dtype = np.dtype(leaf["dtype"])
            n = int(np.prod(leaf["shape"], dtype=np.int64))
            out.append(np.stack([np.frombuffer(r, dtype, n, at).reshape(leaf["shape"])
                                 for r in rows]))
            at += n * dtype.itemsize
        return manifest, out
    import tensorflow as tf

    spec = {f"leaf-{i}": tf.io.FixedLenFeature([], tf.string) for i in range(len(leaves))}
    parsed = [tf.io.parse_single_example(r, spec)
              for r in tf.data.TFRecordDataset(str(directory / "records.tfrecord"))]
    return manifest, [np.stack([tf.io.parse_tensor(p[f"leaf-{i}"], tf.as_dtype(leaf["dtype"])).numpy()
                                for p in parsed]) for i, leaf in enumerate(leaves)]


def assert_holds(leaves: list[np.ndarray], batch: list[np.ndarray]) -> None:
    """The records are the builder's samples, in turn, with their dtypes and shapes."""
    for leaf, want in zip(leaves, batch, strict=True):
        assert leaf.dtype == want.dtype and leaf.shape == (SAMPLES, *want.shape[1:])
        np.testing.assert_array_equal(leaf, np.concatenate([want] * (SAMPLES // BATCH)))


@pytest.fixture(scope="module")
def mlp_sweep(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("byom-pipeline")
    proc = run(cwd, "-m", "framework=torch,tensorflow,jax,keras",
               "model.torch=byom.models:build_torch", "model.keras=byom.models:build_keras",
               "model.jax=byom.models:build_jax")
    jobs = [json.loads(p.read_text())
            for p in sorted(cwd.glob("multirun/*/*/fxtrack_jobs/*.json"))]
    return cwd, proc, {j["name"].split("-")[0]: j for j in jobs}


@pytest.mark.parametrize("framework", ["torch", "tensorflow", "jax"])
def test_a_users_mlp_is_fed_by_the_frameworks_loader_from_its_own_records(mlp_sweep,
                                                                          framework):
    cwd, proc, jobs = mlp_sweep
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = jobs[framework]
    assert job["status"] == "FINISHED", job["error"]
    m, tags = job["metrics"], job["tags"]
    assert m["pipeline_samples_per_s"] > 0 and m["resident_samples_per_s"] > 0
    assert m["throughput_samples_per_s"] > 0
    assert m["input_bound_fraction"] == pytest.approx(
        1 - m["throughput_samples_per_s"] / m["resident_samples_per_s"])
    assert math.isfinite(m["loss_first"]) and math.isfinite(m["loss_last"])
    assert job["guard"] == "ok", job["guard"]
    assert m["flops_per_sample"] > 0  # the framework's own counter, as in scenario=train
    assert tags["fxtrack.pipeline_records"] == FORMATS[framework]
    assert tags["fxtrack.pipeline_work"] == "read + deserialize + collate"
    manifest, leaves = records(cwd, FORMATS[framework])
    assert manifest["inputs"] == {"kind": "array"} and manifest["samples"] == SAMPLES
    assert_holds(leaves, list(models.data(BATCH, 0, 16, 16)))  # the builder's (x, y), seed 0


def test_keras_has_no_pipeline_and_is_skipped_before_any_work(mlp_sweep):
    _, proc, jobs = mlp_sweep
    keras = jobs["keras"]
    assert keras["skipped"] and keras["tags"]["fxtrack.unsupported"] == "true"
    assert "scenario=pipeline is not supported by keras" in keras["error"]
    assert "building custom in keras" not in proc.stderr  # no worker started for it


def test_a_dict_input_lm_from_hugging_face_is_fed_by_the_torch_dataloader(tmp_path):
    """GPT-2 (examples/hf_gpt2.py): inputs {"input_ids": (B, 32) int64}, targets (B, 32) int64,
    written and read back in their structure and dtypes; tokens/s of the fed window."""
    pytest.importorskip("transformers")
    import torch

    proc = run(tmp_path, "framework=torch", "model.torch=hf_gpt2:build_torch", "model.kind=lm")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = tmp_path.glob("outputs/*/*/result.json")
    result = json.loads(path.read_text())
    assert result["status"] == "FINISHED", result["error"]
    m = result["metrics"]
    assert math.isfinite(m["loss_last"]) and m["pipeline_samples_per_s"] > 0
    assert m["tokens_per_s"] == pytest.approx(m["throughput_samples_per_s"] * 32)
    manifest, leaves = records(tmp_path, "npy")
    assert manifest["inputs"] == {"kind": "dict", "keys": ["input_ids"]}
    assert [leaf["name"] for leaf in manifest["leaves"]] == ["inputs.input_ids", "targets"]
    # the builder's tokens (seed 0): inputs the first 32, targets the next-token shift
    tokens = torch.randint(0, 512, (BATCH, 33), generator=torch.Generator().manual_seed(0))
    assert_holds(leaves, [tokens[:, :-1].numpy(), tokens[:, 1:].numpy()])
