"""The memory pre-check covers a user's model (issue 30 item 7): its parameters counted from a
shape-only build (torch ``meta``, a Keras ``StatelessScope``, ``nnx.eval_shape``) by a short
``python -m fxtrack.worker --params`` probe, so that no framework is imported by the
orchestrator, and a model that cannot fit refused in one line before any worker builds it.

The example MLP at ``width=100_000`` holds 10 billion parameters (40 GB of fp32 weights): a
real build could not run here, so a count proves the build was abstract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import job_spec, run_fxtrack, seed_peak_cache

from fxtrack.config import memory

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
from byom import models as byom  # noqa: E402

HUGE = 100_000  # model.kwargs.width: ~1e10 parameters
BUILDERS = {"torch": "byom.models:build_torch", "keras": "byom.models:build_keras",
            "jax": "byom.models:build_jax"}


def env_for(cwd: Path, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": f"{ROOT / 'examples'}:{ROOT}", **seed_peak_cache(cwd / "cache"),
            **extra}


@pytest.mark.parametrize("framework", ["torch", "jax", "tensorflow"])
def test_the_probe_counts_a_model_too_large_to_build_without_building_it(tmp_path, framework):
    spec = job_spec(framework, "custom", tmp_path, arch={**BUILDERS, "kwargs": {"width": HUGE}},
                    batch_size=1)
    path = tmp_path / "spec.json"
    spec.dump(path)
    out = subprocess.run([sys.executable, "-m", "fxtrack.worker", "--params", str(path)],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, **env_for(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer == {"param_count": byom.param_count(width=HUGE)}, answer


def test_a_probe_that_cannot_build_answers_why(tmp_path):
    spec = job_spec("torch", "custom", tmp_path, arch={"torch": "byom.models:no_such_builder"})
    spec.dump(tmp_path / "spec.json")
    out = subprocess.run([sys.executable, "-m", "fxtrack.worker", "--params",
                          str(tmp_path / "spec.json")], capture_output=True, text=True,
                         timeout=300, env={**os.environ, **env_for(tmp_path)})
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert "has no function 'no_such_builder'" in answer["error"]


def test_a_users_model_that_cannot_fit_is_refused_in_one_line_before_any_worker(tmp_path):
    proc = run_fxtrack(tmp_path, "framework=torch", "model=custom", f"model.torch={BUILDERS['torch']}",
                       f"model.kwargs.width={HUGE}", "hardware=cpu", "batch_size=2",
                       env=env_for(tmp_path, **{memory.MEMORY_ENV: "8"}), timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fxtrack:")]
    assert len(lines) == 1, proc.stderr
    count = f"{byom.param_count(width=HUGE):,} parameters, counted from a shape-only build"
    assert "will not fit in memory" in lines[0] and count in lines[0], lines[0]
    assert "more than the 8.0 GiB of FXTRACK_MEMORY_GIB" in lines[0]
    # a lever a user's model takes in torch and JAX (the generic sharding policy); on a CPU
    # host its devices share the RAM, so the fix is more hosts
    assert "parallel=fsdp over hardware.nodes=N hosts" in lines[0]
    assert "with framework=torch or jax" in lines[0]
    assert "[fxtrack] building" not in proc.stderr and not list(tmp_path.glob("outputs/*/*/result.json"))


def test_the_estimate_of_a_users_model_is_its_state_from_the_probes_count():
    from fxtrack import architectures

    arch = architectures.resolve("custom", torch="a.b:c", optimizer="sgd")
    have = memory.Available(1.0 * memory.GIB, "a fake device")
    n = 100_000_000  # 12 B a parameter with SGD: 1.2 GB > 1 GiB
    why = memory.refusal(arch, "train", "fp32", 2, "cpu", source=lambda kind, devices: have,
                         count=lambda: (n, ""))
    assert why is not None and "weights 0.4 + gradients 0.4 + SGD momentum 0.4" in why
    assert memory.refusal(arch, "inference", "fp32", 2, "cpu",
                          source=lambda kind, devices: have, count=lambda: (n, "")) is None
    # not counted (a builder the probe could not build): the check is skipped
    assert memory.refusal(arch, "train", "fp32", 2, "cpu", source=lambda kind, devices: have,
                          count=lambda: (None, "ValueError: ...")) is None
