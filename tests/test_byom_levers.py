"""parallel=fsdp and memory=checkpoint for a user's model (issue 30 item 4) in torch and JAX, at
tiny size on CPU devices: the generic policy (the items of the model's first repeated container,
or the classes model.shard_modules / model.remat_modules name) shards for real (each of 2 ranks /
devices holds half of the parameters and their optimiser state) and recomputes the blocks it
found, changing no math (losses equal to ddp / memory=none within 1e-4); a misnamed class, a
model with no blocks to recompute, and TensorFlow's declared absence are refused before any work.
The 2-rank runs are tests/levers_ranks.py, as for fxtrack's own models (test_memory_levers.py)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
from conftest import backend_class, job_spec, run_fxtrack, seed_peak_cache
from test_memory_levers import TOL, ranks

from fxtrack.worker.__main__ import prepare_environment, run

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
from byom import blocks  # noqa: E402

BUILDER = {"torch": "byom.blocks:build_torch", "jax": "byom.blocks:build_jax"}


@pytest.mark.slow
@pytest.mark.parametrize("framework, port", [("torch", 29571), ("jax", 0)])
def test_fsdp_shards_a_users_model_and_keeps_the_math(framework, port):
    arch = json.dumps({framework: BUILDER[framework]})
    ddp = ranks(framework, "custom", "ddp", "none", port, arch)
    fsdp = ranks(framework, "custom", "fsdp", "none", port + 1 if port else 0, arch)
    assert set(fsdp) == set(ddp) == ({0, 1} if framework == "torch" else {0})
    for rank, shard in fsdp.items():
        assert shard["total"] == ddp[rank]["total"] == ddp[rank]["local"] == blocks.param_count()
        assert shard["local"] == shard["total"] / 2  # every dimension even: exact halves
        # parameters + AdamW's two moments, 4 bytes each: 12 bytes per parameter held
        assert ddp[rank]["state_bytes"] == pytest.approx(12 * shard["total"], rel=0.01)
        assert shard["state_bytes"] == pytest.approx(ddp[rank]["state_bytes"] / 2, rel=0.01)
        assert shard["losses"] == pytest.approx(ddp[rank]["losses"], abs=TOL)
        assert shard["losses"][-1] < shard["losses"][0]
        if framework == "torch":  # the policy's units: each Block, then the root
            assert shard["fsdp_units"] == 3 and ddp[rank]["fsdp_units"] == 0


def _losses(framework: str, builder: str, memory: str, monkeypatch, **dims) -> tuple[list, list]:
    """Three training steps of the user's model in-process; (losses, the class names of the
    blocks the backend handed to ``models.checkpoint_blocks``)."""
    models = importlib.import_module(f"fxtrack.frameworks.{framework}.models")
    seen: list[str] = []
    original = getattr(models.checkpoint_blocks, "original", models.checkpoint_blocks)

    def spy(units):
        units = list(units)
        seen.extend(type(u).__name__ for u in units)
        return original(units)

    spy.original = original  # a second call spies on the function itself, not on this spy
    monkeypatch.setattr(models, "checkpoint_blocks", spy)
    spec = job_spec(framework, "custom", memory=memory, arch={framework: builder, **dims})
    prepare_environment(spec)
    backend = backend_class(spec)(spec)
    backend.device_kind()
    backend.build(4)
    return [backend.loss_value(backend.train_step()) for _ in range(3)], seen


@pytest.mark.parametrize("framework, builder, dims, recomputed", [
    ("torch", "byom.blocks:build_torch", {}, ["Block", "Block"]),  # the first repeated container
    ("torch", "byom.models:build_torch", {"remat_modules": ["Linear"]}, ["Linear"] * 3),
    ("jax", "byom.blocks:build_jax", {}, ["Block", "Block"]),
    ("jax", "byom.models:build_jax", {}, ["Linear"] * 3),  # its nnx.List of 3 Linear layers
], ids=["torch-blocks", "torch-mlp-named", "jax-blocks", "jax-mlp"])
def test_remat_recomputes_the_policys_blocks_and_keeps_the_math(monkeypatch, framework, builder,
                                                                dims, recomputed):
    none, untouched = _losses(framework, builder, "none", monkeypatch, **dims)
    remat, seen = _losses(framework, builder, "checkpoint", monkeypatch, **dims)
    assert untouched == [] and seen == recomputed
    assert remat == pytest.approx(none, abs=TOL)
    assert remat[-1] < remat[0]


@pytest.mark.parametrize("framework, builder, levers, dims, says", [
    ("torch", "byom.blocks:build_torch", dict(memory="checkpoint"), {"remat_modules": ["Blok"]},
     "model.remat_modules names Blok, no class of the model of model.torch=byom.blocks:"
     "build_torch (its classes: Block, Linear, ModuleList, ResidualMLP)"),
    ("torch", "byom.models:build_torch", dict(memory="checkpoint"), {},
     "memory=checkpoint found no blocks to recompute in the model of model.torch=byom.models:"
     "build_torch"),
    ("jax", "byom.blocks:build_jax", dict(memory="checkpoint"), {"remat_modules": ["Blok"]},
     "model.remat_modules names Blok"),
    ("jax", "byom.blocks:build_jax", {}, {"shard_modules": ["Block"]},
     "model.shard_modules is not supported by jax"),
], ids=["torch-misnamed", "torch-no-blocks", "jax-misnamed", "jax-shard-modules"])
def test_a_policy_that_cannot_apply_is_a_not_supported_run_before_the_timed_window(
        tmp_path, framework, builder, levers, dims, says):
    spec = job_spec(framework, "custom", tmp_path, arch={framework: builder, **dims}, **levers)
    prepare_environment(spec)
    result = run(spec)
    assert result.status == "FAILED" and result.tags["unsupported"] == "true", result.error
    assert says in result.error and "\n" not in result.error
    assert "step_time_ms_p50" not in result.metrics


def test_the_keys_reach_the_worker_through_the_cli(tmp_path):
    """model.remat_modules from the command line, one sweep: a named class runs to the end, a
    misnamed one is its cell's one-line "not supported" from the worker; a value that is no
    class name is refused at validation."""
    # no memory pre-check (its own framework import; test_byom_memory.py covers it), the peak
    # FLOP/s calibration cached
    env = {"PYTHONPATH": f"{ROOT / 'examples'}:{ROOT}", "FXTRACK_MEMORY_GIB": "off",
           **seed_peak_cache(tmp_path / "cache")}
    base = ["framework=torch", "model=custom", "model.torch=byom.blocks:build_torch",
            "memory=checkpoint", "batch_size=2", "steps=2", "warmup_steps=1", "hardware=cpu"]
    proc = run_fxtrack(tmp_path, "-m", *base, "model.remat_modules=[Block],[Blok]", env=env,
                       timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = [json.loads(p.read_text())
            for p in sorted(tmp_path.glob("multirun/*/*/fxtrack_jobs/*.json"))]
    by_names = {tuple(j["params"]["model.remat_modules"]): j for j in jobs}
    assert by_names[("Block",)]["status"] == "FINISHED", by_names[("Block",)]["error"]
    assert by_names[("Block",)]["params"]["memory"] == "checkpoint"
    assert by_names[("Block",)]["metrics"]["param_count"] == blocks.param_count()
    refused = by_names[("Blok",)]
    assert refused["tags"]["fxtrack.unsupported"] == "true"
    assert refused["error"].startswith("NotSupported: model.remat_modules names Blok, no class")
    assert "step_time_ms_p50" not in refused["metrics"]
    proc = run_fxtrack(tmp_path, *base, "model.remat_modules=[blocks.0]", env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "model.remat_modules takes class names, got 'blocks.0'" in proc.stderr
    assert "[fxtrack] building" not in proc.stderr


def test_tensorflow_keeps_its_declared_refusal_and_torch_jax_lift_the_custom_one():
    from fxtrack.frameworks import user_builder
    from fxtrack.frameworks.declaration import CUSTOM_UNSUPPORTED, declaration
    from fxtrack.scenarios import rules

    for lever in (dict(parallel="fsdp", devices=2), dict(memory="checkpoint")):
        field, value = next(iter(lever.items()))
        for fw in ("torch", "tensorflow", "jax", "keras"):
            spec = job_spec(fw, "custom", arch={"torch": "a:b", "keras": "a:b", "jax": "a:b"},
                            **lever)
            framework = declaration(spec.package)
            why = rules.refusal(rules.Combination.of(spec, "cpu"), framework)
            if fw in ("torch", "jax"):
                assert why is None, why
            else:  # the framework has no such lever for any model: its declared reason
                assert why.startswith(f"{field}={value} is not supported by {fw}"), why
        # a framework declaring user_model but no policy would get CUSTOM_UNSUPPORTED's reason
        why = user_builder.refusal("train", lever.get("memory", "none"),
                                   lever.get("parallel", "ddp"))
        assert why == (f"{field}={value} is not supported for model=custom: "
                       f"{CUSTOM_UNSUPPORTED[f'{field}={value}']}")


@pytest.mark.slow
def test_hf_gpt2_through_fsdp_and_remat_in_torch(monkeypatch):
    """examples/hf_gpt2.py, tiny: its transformer.h (an nn.ModuleList of GPT2Block) is what the
    default policy finds; the tied embedding / output matrix stays in the root unit."""
    pytest.importorskip("transformers")
    arch = json.dumps({"torch": "hf_gpt2:build_torch"})
    ddp = ranks("torch", "custom", "ddp", "none", 29581, arch)
    fsdp = ranks("torch", "custom", "fsdp", "none", 29582, arch)
    for rank, shard in fsdp.items():
        assert shard["fsdp_units"] == 3  # each GPT2Block, then the root
        assert shard["local"] == pytest.approx(shard["total"] / 2, rel=0.01)
        assert shard["losses"] == pytest.approx(ddp[rank]["losses"], abs=TOL)
    none, _ = _losses("torch", "hf_gpt2:build_torch", "none", monkeypatch)
    remat, seen = _losses("torch", "hf_gpt2:build_torch", "checkpoint", monkeypatch)
    assert seen == ["GPT2Block", "GPT2Block"]
    assert remat == pytest.approx(none, abs=TOL)
