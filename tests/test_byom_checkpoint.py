"""scenario=checkpoint for a user's model in JAX and TensorFlow (issue 30 item 2; torch's is in
test_byom_stateful.py): the full training state saved, moved on one step, restored and the step
replayed exactly (Dropout's RNG state and BatchNorm's statistics included), and a serving export
in the framework's own format (``jax.export`` + Orbax; a Keras ``model.export`` SavedModel)
loaded back and checked against the live model's outputs. In-process workers at tiny size."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import job_spec, run_fxtrack

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
from byom import lm, stateful  # noqa: E402

CASES = [
    ("jax", "byom.stateful:build_jax", stateful.param_count()),
    ("tensorflow", "byom.stateful:build_keras", stateful.param_count()),
    ("jax", "byom.lm:build_jax", lm.param_count()),  # integer token inputs
    ("tensorflow", "byom.lm:build_keras", lm.param_count()),
]


@pytest.mark.parametrize("framework,builder,params", CASES,
                         ids=[f"{fw}-{b.split(':')[0]}" for fw, b, _ in CASES])
def test_a_users_model_restores_exactly_and_its_export_matches_the_live_model(
        tmp_path, monkeypatch, framework, builder, params):
    from fxtrack.worker.__main__ import prepare_environment, run

    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    key = "keras" if framework == "tensorflow" else framework
    spec = job_spec(framework, "custom", tmp_path, arch={key: builder}, batch_size=4,
                    scenario="checkpoint", runner="fxtrack.scenarios.checkpoint.runner:run")
    prepare_environment(spec)
    result = run(spec)
    assert result.status == "FINISHED", result.error
    assert result.guard == "ok", result.guard
    m = result.metrics
    assert m["checkpoint_restore_exact"] == 1.0
    assert m["loss_after_restore"] == m["loss_next_step"]
    assert 0.0 <= m["export_max_rel_err"] <= 1e-4
    assert m["export_mib"] > 0 and m["export_latency_ms_p50"] > 0
    assert m["param_count"] == params


def test_the_export_guard_fails_a_run_whose_export_differs(tmp_path, monkeypatch):
    """The guard reads export_error: an export that drifts is a failed guard, not a figure."""
    from fxtrack.frameworks.jax import user_model
    from fxtrack.worker.__main__ import prepare_environment, run

    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.setattr(user_model, "export_error", lambda backend: 0.5)
    spec = job_spec("jax", "custom", tmp_path, arch={"jax": "byom.lm:build_jax"},
                    scenario="checkpoint", runner="fxtrack.scenarios.checkpoint.runner:run")
    prepare_environment(spec)
    result = run(spec)
    assert result.status == "FINISHED", result.error
    assert result.guard.startswith("the exported model's outputs differ from the live model's")


def test_keras_refuses_checkpoint_of_a_users_model_with_its_reason(tmp_path):
    proc = run_fxtrack(tmp_path, "framework=keras", "scenario=checkpoint", "model=custom",
                       "model.keras=byom.lm:build_keras", "hardware=cpu",
                       env={"PYTHONPATH": f"{ROOT / 'examples'}:{ROOT}"}, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "scenario=checkpoint is not supported" in proc.stderr
    assert "[fxtrack] building" not in proc.stderr
