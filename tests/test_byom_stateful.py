"""Stateful layers in a user's model (issue 30 item 1): BatchNorm and Dropout, whose state the
step updates (Keras' seed generator, NNX's RNG count, the running statistics), train, infer and
are FLOP-counted in every framework and in Keras on each backend, with one parameter count; a
FLOP counter that cannot count leaves no flops_per_sample, a tag saying why, and the run
FINISHES."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from conftest import run_fxtrack, seed_peak_cache

from fxtrack.worker.protocol import Result
from fxtrack.scenarios.timed import user_flops

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
from byom import stateful  # noqa: E402

TINY = ["batch_size=4", "steps=3", "warmup_steps=1", "hardware=cpu"]
BUILDERS = ["model.torch=byom.stateful:build_torch", "model.keras=byom.stateful:build_keras",
            "model.jax=byom.stateful:build_jax"]


def env_for(cwd: Path) -> dict[str, str]:
    return {"PYTHONPATH": f"{ROOT / 'examples'}:{ROOT}", **seed_peak_cache(cwd / "cache")}


def jobs_of(cwd: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(cwd.glob("multirun/*/*/fxtrack_jobs/*.json"))]


def finished_with_flops(job: dict, name: str) -> None:
    assert job["status"] == "FINISHED", (name, job["error"])
    assert job["metrics"]["param_count"] == stateful.param_count(), name
    assert job["metrics"]["flops_per_sample"] > 0, name
    assert "fxtrack.flops_unavailable" not in job["tags"], name


@pytest.mark.slow
def test_batchnorm_and_dropout_train_and_infer_in_every_framework(tmp_path):
    proc = run_fxtrack(tmp_path, "-m", "framework=torch,tensorflow,jax", "scenario=train,inference",
                       "model=custom", *BUILDERS, *TINY, env=env_for(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = jobs_of(tmp_path)
    cells = {(j["tags"]["fxtrack.framework"], j["tags"]["fxtrack.scenario"]) for j in jobs}
    assert cells == {(fw, sc) for fw in ("torch", "tensorflow", "jax")
                     for sc in ("train", "inference")}
    for job in jobs:
        finished_with_flops(job, job["name"])
        if job["tags"]["fxtrack.scenario"] == "train":
            assert job["guard"] == "ok", (job["name"], job["guard"])


@pytest.mark.slow
def test_batchnorm_and_dropout_train_in_keras_on_each_backend(tmp_path):
    proc = run_fxtrack(tmp_path, "-m", "framework=keras",
                       "framework.keras_backend=jax,torch,tensorflow", "model=custom",
                       BUILDERS[1], *TINY, env=env_for(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = {j["tags"]["fxtrack.keras_backend"]: j for j in jobs_of(tmp_path)}
    assert set(jobs) == {"jax", "torch", "tensorflow"}
    for name, job in jobs.items():
        finished_with_flops(job, name)


def test_a_counter_that_cannot_count_leaves_a_tag_and_no_figure():
    def train_flops_per_sample(backend):
        raise ValueError("an op the counter has no rule for\nsecond line")

    module = types.SimpleNamespace(train_flops_per_sample=train_flops_per_sample)
    # the counter is the capability the family names (model=custom: UserModel.builder_capability)
    backend = types.SimpleNamespace(capability={"user_model": module}.__getitem__,
                                    arch={"family": "custom"})
    result = Result(result_id="r")
    assert user_flops(backend, result, "train")() is None
    assert result.tags["flops_unavailable"] == "ValueError: an op the counter has no rule for"
    assert "flops_source" not in result.tags


def test_torch_checkpoint_of_a_users_model_restores_exactly_and_exports(tmp_path):
    """scenario=checkpoint for model=custom (issue 30 item 2, torch): Dropout's draws replay
    from the restored RNG state, and the loaded torch.export program matches the live model."""
    proc = run_fxtrack(tmp_path, "framework=torch", "scenario=checkpoint", "model=custom",
                       BUILDERS[0], *TINY, env=env_for(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = tmp_path.glob("outputs/*/*/result.json")
    result = json.loads(path.read_text())
    assert result["status"] == "FINISHED" and result["guard"] == "ok", result["guard"]
    m = result["metrics"]
    assert m["checkpoint_restore_exact"] == 1.0
    assert 0.0 <= m["export_max_rel_err"] <= 1e-4
    assert m["export_latency_ms_p50"] > 0 and m["param_count"] == stateful.param_count()


def test_checkpoint_of_a_users_model_elsewhere_is_refused_before_any_work(tmp_path):
    proc = run_fxtrack(tmp_path, "framework=keras", "scenario=checkpoint", "model=custom",
                       BUILDERS[1], *TINY, env=env_for(tmp_path), timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "scenario=checkpoint is not supported for model=custom" in proc.stderr
    assert "[fxtrack] building" not in proc.stderr
