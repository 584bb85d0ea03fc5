"""Bring your own model (model=custom, docs/your-own-model.md): a user's package outside the
checkout, one MLP written in PyTorch, Keras and Flax NNX, run through the documented command
lines in all three frameworks and the Keras builder on framework=keras' three backends; equal parameter counts, FLOPs from each framework's own counter
against a hand count, the report; and every error of the contract refused in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import job_spec, report_here, run_fxtrack, seed_peak_cache

from fxtrack import architectures
from fxtrack.report import tables

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
from byom import models as byom  # noqa: E402  (the example the docs show)

WIDTH = 64  # model.kwargs.width: tiny
TINY = ["batch_size=2", "steps=3", "warmup_steps=1", "hardware=cpu"]
BUILDERS = ["model.torch=mypkg.models:build_torch", "model.keras=mypkg.models:build_keras",
            "model.jax=mypkg.models:build_jax"]


def user_package(root: Path) -> dict[str, str]:
    """``mypkg/models.py`` (the example's builders) in ``root``, outside the checkout; the
    environment that puts it on the worker's path, with a seeded peak cache."""
    (root / "mypkg").mkdir(parents=True, exist_ok=True)
    (root / "mypkg" / "__init__.py").write_text("")
    shutil.copy(ROOT / "examples" / "byom" / "models.py", root / "mypkg" / "models.py")
    return {"PYTHONPATH": f"{root}:{ROOT}", **seed_peak_cache(root / "cache")}


def sweep_jobs(cwd: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(cwd.glob("multirun/*/*/fxtrack_jobs/*.json"))]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The contract's sweep, once, at tiny size: (directory, completed process, env, jobs)."""
    cwd = tmp_path_factory.mktemp("byom")
    env = user_package(cwd)
    proc = run_fxtrack(cwd, "-m", "framework=torch,tensorflow,jax", "model=custom", *BUILDERS,
                       f"model.kwargs.width={WIDTH}", *TINY, env=env)
    return cwd, proc, env, sweep_jobs(cwd)


def test_a_users_model_runs_in_every_framework_with_the_same_parameters(sweep):
    _, proc, _, jobs = sweep
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_fw = {j["tags"]["fxtrack.framework"]: j for j in jobs}
    assert set(by_fw) == {"torch", "tensorflow", "jax"}
    expected = byom.param_count(width=WIDTH)
    for fw, job in by_fw.items():
        assert job["status"] == "FINISHED", (fw, job["error"])
        assert job["metrics"]["param_count"] == expected, fw
        assert job["guard"] == "ok", (fw, job["guard"])  # the example's data is learnable
        assert job["metrics"]["loss_last"] < job["metrics"]["loss_first"], fw
        assert job["metrics"]["code_sloc_model"] > 0, fw  # the builder's module, by radon
        assert job["tags"]["fxtrack.model"] == "custom"


def test_flops_come_from_each_frameworks_counter_within_15_percent_of_the_hand_count(sweep):
    """Hand count (examples/byom/models.py): matmuls only, 2 per multiply-add, forward 2W,
    backward 4W less the first layer's input gradient: 6W - 2*16*width per sample."""
    _, _, _, jobs = sweep
    hand = byom.train_flops_per_sample(width=WIDTH)
    sources = {}
    for job in jobs:
        fw = job["tags"]["fxtrack.framework"]
        sources[fw] = job["tags"]["fxtrack.flops_source"]
        assert job["metrics"]["flops_per_sample"] == pytest.approx(hand, rel=0.15), fw
        assert job["metrics"]["achieved_tflops"] > 0
    assert sources == {"torch": "torch.utils.flop_counter", "jax": "jax.cost_analysis",
                       "tensorflow": "tf.compat.v1.profiler"}


@pytest.fixture(scope="module")
def keras_sweep(tmp_path_factory):
    """The same model.keras builder through Keras' own compile + train_on_batch on each of its
    backends (a key only framework=keras has, so a sweep of its own): the jobs by backend."""
    cwd = tmp_path_factory.mktemp("byom-keras")
    proc = run_fxtrack(cwd, "-m", "framework=keras", "framework.keras_backend=jax,torch,tensorflow",
                       "model=custom", BUILDERS[1], f"model.kwargs.width={WIDTH}", *TINY,
                       env=user_package(cwd))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {j["tags"]["fxtrack.keras_backend"]: j for j in sweep_jobs(cwd)}


def test_keras_runs_the_users_model_on_each_backend_with_the_same_parameters_and_flops(
        sweep, keras_sweep):
    native = {j["tags"]["fxtrack.framework"]: j for j in sweep[3]}
    hand = byom.train_flops_per_sample(width=WIDTH)
    assert set(keras_sweep) == {"jax", "torch", "tensorflow"}
    for name, job in keras_sweep.items():
        assert job["status"] == "FINISHED", (name, job["error"])
        assert job["metrics"]["param_count"] == native["tensorflow"]["metrics"]["param_count"]
        assert job["metrics"]["param_count"] == byom.param_count(width=WIDTH), name
        assert job["guard"] == "ok", (name, job["guard"])
        assert job["metrics"]["loss_last"] < job["metrics"]["loss_first"], name
        assert job["metrics"]["flops_per_sample"] == pytest.approx(hand, rel=0.15), name
        assert job["tags"]["fxtrack.compile_mode"].startswith(f"keras-{name}:")
    assert {name: job["tags"]["fxtrack.flops_source"] for name, job in keras_sweep.items()} == {
        "jax": "jax.cost_analysis", "torch": "torch.utils.flop_counter",
        "tensorflow": "tf.compat.v1.profiler"}


def test_the_report_shows_the_users_model(sweep):
    cwd = sweep[0]
    proc = report_here(cwd, "--no-log", "--format", "md")
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (cwd / "fxtrack-report" / "report.md").read_text()
    # the throughput table's row (the answer blocks above it have "| custom" rows of their own)
    row = next(line for line in text.splitlines() if line.startswith("| custom") and "x)" in line)
    assert row.count("x)") == 3, row  # a throughput cell per framework
    assert f"{tables.DIFFERENT} custom" not in text  # same parameter counts: no mark


def test_the_report_marks_a_model_whose_parameter_counts_differ():
    frame = pd.DataFrame([
        {"framework": fw, "model": "custom", "scenario": "train", "precision": "fp32",
         "devices": 1, "hardware": "cpu", "check": "ok", "guard": None,
         "metrics.param_count": params, "metrics.throughput_samples_per_s": 10.0}
        for fw, params in (("torch", 1000), ("jax", 1100))])
    table = tables.throughput(frame)[0]
    assert table.rows[0][0] == f"custom {tables.DIFFERENT}"
    note = next(n for n in table.notes if n.startswith(tables.DIFFERENT))
    assert "torch 1,000" in note and "jax 1,100" in note and "+10.0%" in note


# --- errors: one line, before any timed work -------------------------------------------------

def refused(cwd: Path, env: dict, *args: str) -> str:
    """A single run that must exit 2 at validation; its one-line reason."""
    started = time.monotonic()
    proc = run_fxtrack(cwd, *args, *TINY, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert time.monotonic() - started < 60  # no worker started: seconds (a busy machine)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fxtrack:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_a_missing_module_is_refused_in_one_line_within_seconds(tmp_path):
    env = user_package(tmp_path)
    line = refused(tmp_path, env, "framework=torch", "model=custom",
                   "model.torch=nosuchpkg.models:build_torch")
    assert "model.torch=nosuchpkg.models:build_torch" in line and "nosuchpkg" in line


def test_an_unset_builder_and_an_unsupported_lever_are_refused(tmp_path):
    env = user_package(tmp_path)
    line = refused(tmp_path, env, "framework=jax", "model=custom",
                   "model.torch=mypkg.models:build_torch")
    assert "model.jax is not set" in line and "framework=jax" in line
    line = refused(tmp_path, env, "framework=tensorflow", "model=custom", BUILDERS[1],
                   "memory=checkpoint")
    assert "memory=checkpoint is not supported by tensorflow" in line
    line = refused(tmp_path, env, "framework=torch", "model=custom", *BUILDERS[:1],
                   "model.optimizer=adam")
    assert "model.optimizer must be one of adamw, sgd" in line


def test_a_sweep_skips_a_refused_cell_as_not_supported_and_runs_no_worker(tmp_path):
    env = user_package(tmp_path)
    proc = run_fxtrack(tmp_path, "-m", "framework=torch,jax", "model=custom",
                       "model.torch=nosuchpkg.models:build_torch", *TINY, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]  # not supported is not a failure
    jobs = {j["name"].split("-")[0]: j for j in sweep_jobs(tmp_path)}
    assert set(jobs) == {"torch", "jax"}
    assert all(j["skipped"] and j["tags"]["fxtrack.unsupported"] == "true" for j in jobs.values())
    assert "nosuchpkg" in jobs["torch"]["error"] and "model.jax is not set" in jobs["jax"]["error"]
    assert "NOT SUPPORTED" in proc.stderr and "[fxtrack] building" not in proc.stderr


BROKEN = '''
import numpy as np
import torch
from torch import nn


def no_tuple(batch_size, seed):
    return nn.Linear(4, 2)


def vector_loss(batch_size, seed):
    x, y = torch.ones(batch_size, 4), torch.ones(batch_size, 2)
    return nn.Linear(4, 2), (x, y), lambda out, target: ((out - target) ** 2).mean(dim=1)


def numpy_for_torch(batch_size, seed):
    x = np.ones((batch_size, 4), np.float32)
    return nn.Linear(4, 2), (x, x), nn.functional.mse_loss


def torch_for_jax(batch_size, seed):
    return vector_loss(batch_size, seed)
'''


@pytest.mark.parametrize("framework,builder,expected", [
    ("torch", "broken:missing", "module broken has no function 'missing'"),
    ("torch", "broken:no_tuple", "must return (model, (inputs, targets), loss_fn); got "
                                 "torch.nn.modules.linear.Linear"),
    ("torch", "broken:vector_loss", "a scalar tensor (shape ()), got shape (2,)"),
    ("torch", "broken:numpy_for_torch", "returned an input or target of type numpy.ndarray; "
                                        "framework=torch needs torch.Tensor"),
    ("jax", "broken:torch_for_jax", "returned a model of type torch.nn.modules.linear.Linear; "
                                    "framework=jax needs a flax.nnx.Module"),
])
def test_a_broken_builder_is_not_supported_before_any_timed_work(tmp_path, monkeypatch,
                                                                 framework, builder, expected):
    from fxtrack.worker.__main__ import run

    (tmp_path / "broken.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    arch = {"torch": builder, "jax": builder}
    spec = job_spec(framework, "custom", tmp_path, arch=arch)
    result = run(spec)
    assert result.status == "FAILED" and result.tags.get("unsupported") == "true", result.error
    assert expected in result.error and "\n" not in result.error
    assert "step_time_ms_p50" not in result.metrics  # refused before the timed window


def test_custom_arch_has_no_sizes_and_carries_the_builders():
    arch = architectures.resolve("custom", "tiny", torch="a.b:c", kwargs={"width": 3}, lr=0.01)
    assert arch.family == "custom" and not arch.canonical
    again = architectures.Arch.from_json(json.loads(json.dumps(arch.to_json())))
    assert again.torch == "a.b:c" and again.kwargs == {"width": 3} and again.jax is None


@pytest.mark.parametrize("framework", ["torch", "tensorflow", "jax"])
def test_inference_of_a_users_model_counts_forward_flops_by_hand(tmp_path, monkeypatch,
                                                                 framework):
    """scenario=inference on the example MLP, in-process: forward FLOPs 2W per sample."""
    from fxtrack.worker.__main__ import prepare_environment, run

    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    builders = {"torch": "byom.models:build_torch", "keras": "byom.models:build_keras",
                "jax": "byom.models:build_jax"}
    spec = job_spec(framework, "custom", tmp_path, arch=builders, scenario="inference",
                    runner="fxtrack.scenarios.inference.runner:run")
    prepare_environment(spec)
    result = run(spec)
    assert result.status == "FINISHED", result.error
    weights = byom.param_count() - (2 * 256 + 16)  # less the biases
    assert result.metrics["flops_per_sample"] == pytest.approx(2 * weights, rel=0.15)
    assert result.metrics["param_count"] == byom.param_count()
    assert result.metrics["latency_ms_p50"] > 0 and result.tags["flops_source"]


KERAS_BROKEN = '''
import keras
import numpy as np


def two_targets(batch_size, seed):
    x = np.ones((batch_size, 4), np.float32)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    return model, (x, (x, x)), lambda out, target: keras.ops.mean(out)


def vector_loss(batch_size, seed):
    x, y = np.ones((batch_size, 4), np.float32), np.ones((batch_size, 2), np.float32)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    return model, (x, y), lambda out, target: keras.ops.mean((out - target) ** 2, axis=1)
'''
KERAS_RUN = '''
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from conftest import job_spec
from fxtrack.worker.__main__ import prepare_environment, run
errors = []
for builder in ("broken_keras:two_targets", "broken_keras:vector_loss"):
    spec = job_spec("keras", "custom", None, arch={"keras": builder},
                    framework_settings={"keras_backend": "tensorflow"})
    prepare_environment(spec)
    result = run(spec)
    errors.append([result.status, result.tags.get("unsupported"), result.error,
                   "step_time_ms_p50" in result.metrics])
print(json.dumps(errors))
'''


def test_keras_refuses_what_its_compile_cannot_take_before_any_timed_work(tmp_path):
    """Keras' compile applies a loss per output: nested targets are refused when built, as
    a loss that is not a scalar is (one worker process, the TensorFlow backend)."""
    (tmp_path / "broken_keras.py").write_text(KERAS_BROKEN)
    proc = subprocess.run([sys.executable, "-c", KERAS_RUN, str(tmp_path), str(ROOT / "tests")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (targets, loss) = json.loads(proc.stdout.strip().splitlines()[-1])
    assert targets[:2] == ["FAILED", "true"] and not targets[3], targets
    assert "returned targets of type tuple; framework=keras needs one NumPy array" in targets[2]
    assert loss[:2] == ["FAILED", "true"] and not loss[3], loss
    assert "a scalar (shape ()), got shape (2,)" in loss[2] and "\n" not in loss[2]
