"""A combination a framework has no path for is a "not supported" cell, never a crash: refused
when the config is validated (a single run stops in one line, exit 2; a sweep skips the cell and
runs the rest), and by the worker as a backstop (NotSupported: tagged, shown as such in a sweep's
closing table, not counted as a failure)."""

from __future__ import annotations

import re

import time

import pytest

from conftest import job_spec, run_fxtrack, seed_peak_cache
from fxtrack.config.frameworks import declared

from fxtrack.frameworks.base import Backend
from fxtrack.frameworks.declaration import NotSupported
from fxtrack.orchestrator.sweep import _unsupported, closing_table, skipped_job
from fxtrack.scenarios.rules import Combination, refusal
from fxtrack.worker.__main__ import run


class NoPathBackend(Backend):
    """Stands in for a framework: builds nothing, has no path for the scenario."""
    name = "nopath"

    def version(self): return "0"
    def device_kind(self): return "cpu"
    def build(self, batch_size): pass
    def param_count(self): return 0
    def train_step(self): return None
    def loss_value(self, handle): return 0.0


def no_path(backend, result):
    raise NotSupported("parallel=fsdp is not supported by nopath 0: use parallel=ddp")


def crash(backend, result):
    raise RuntimeError("out of cheese")


def not_implemented(backend, result):
    raise NotImplementedError("half-written")


def test_not_supported_is_tagged_unsupported_and_other_errors_are_not(tmp_path, monkeypatch):
    import dataclasses

    from fxtrack.frameworks import torch as torch_package

    monkeypatch.setattr(torch_package, "FRAMEWORK", dataclasses.replace(
        torch_package.FRAMEWORK, backend="test_unsupported:NoPathBackend"))
    spec = job_spec("torch", "vit", tmp_path, runner="test_unsupported:no_path")
    result = run(spec)
    assert result.status == "FAILED" and result.tags["unsupported"] == "true"
    assert "not supported by nopath" in result.error
    spec.runner = "test_unsupported:crash"
    assert "unsupported" not in run(spec).tags
    spec.runner = "test_unsupported:not_implemented"  # a bug, not a declared absence
    assert "unsupported" not in run(spec).tags


def test_closing_table_shows_not_supported_cells():
    jobs = [{"name": "torch-vit", "status": "FINISHED", "guard": "ok", "error": None,
             "metrics": {"throughput_samples_per_s": 3.0}, "tags": {}},
            {"name": "tensorflow-vit", "status": "FAILED", "guard": "ok",
             "error": "NotSupported: not supported by tensorflow", "metrics": {},
             "tags": {"fxtrack.unsupported": "true"}}]
    assert [_unsupported(j) for j in jobs] == [False, True]
    table = closing_table(jobs)
    assert "tensorflow-vit  NOT SUPPORTED" in table and "torch-vit       FINISHED" in table
    skipped = skipped_job("jax-vit", "parallel=fsdp with devices=1 is not supported by jax: ...")
    assert _unsupported(skipped)
    assert "jax-vit         NOT SUPPORTED (not run)  " in closing_table(jobs + [skipped])


# --- refused before any work (fxtrack.scenarios.rules, checked when the config is validated) ----


@pytest.mark.parametrize("levers, says", [
    (dict(framework="tensorflow", parallel="fsdp", devices=2),
     "parallel=fsdp is not supported by tensorflow: tf.distribute has no sharded-state"),
    (dict(framework="tensorflow", memory="checkpoint"), "use framework=torch or framework=jax"),
    (dict(runtime="tensorrt"), "runtime=tensorrt with scenario=train is not supported by torch: "
                               "a deployment runtime or quantisation serves a model for "
                               "inference only; add scenario=inference"),
    (dict(quantize="dynamic_int8"), "quantize=dynamic_int8 with scenario=train"),
    (dict(parallel="fsdp"), "parallel=fsdp with devices=1 is not supported by torch: sharding "
                            "needs more than one device; set devices=2 or more, or parallel=ddp"),
    (dict(scenario="inference", runtime="tensorrt", device_kind="cpu"),
     "TensorRT needs an NVIDIA GPU"),
    (dict(scenario="inference", runtime="tensorrt", quantize="dynamic_int8"),
     "TensorRT's int8 is static"),
    (dict(scenario="inference", runtime="onnxruntime", precision="bf16"),
     "exported artefacts are fp32; use precision=fp32"),
    (dict(scenario="inference", runtime="tflite"), "runtime=tflite is not supported by torch: "
                                                   "TFLite export is TensorFlow's"),
    (dict(scenario="inference", framework="tensorflow", quantize="dynamic_int8"),
     "use runtime=tflite"),
    (dict(scenario="inference", quantize="dynamic_int8", device_kind="gpu"),  # a declared Limit
     "quantize=dynamic_int8 with runtime=native on a GPU is not supported by torch: its dynamic "
     "int8 kernels are CPU-only"),
    (dict(framework="tensorflow", devices=2, nodes=2, device_kind="cpu"),
     "one replica per CPU worker"),
])
def test_combinations_without_a_path_are_refused_naming_the_fix(levers, says):
    levers = dict(dict(framework="torch", scenario="train", precision="fp32"), **levers)
    why = refusal(Combination(**levers), declared()[levers["framework"]])
    assert why is not None and says in why, why
    assert "\n" not in why


@pytest.mark.parametrize("levers", [
    dict(framework="jax", parallel="fsdp", devices=2),
    dict(framework="torch", parallel="fsdp", devices=1, nodes=2),
    dict(framework="torch", scenario="scaling", parallel="fsdp", devices=1),  # the x1 baseline
    dict(framework="torch", scenario="inference", quantize="dynamic_int8", device_kind="cpu"),
    dict(framework="torch", scenario="inference", runtime="tensorrt"),  # auto: the worker's call
    dict(framework="tensorflow", scenario="inference", runtime="tflite", precision="tf32"),
])
def test_combinations_with_a_path_pass(levers):
    levers = dict(dict(scenario="train", precision="fp32"), **levers)
    assert refusal(Combination(**levers), declared()[levers["framework"]]) is None


def test_auto_hardware_is_a_cpu_where_no_gpu_is_visible(monkeypatch):
    from fxtrack.config.validate import expected_device_kind

    assert (expected_device_kind("cpu"), expected_device_kind("gpu")) == ("cpu", "gpu")
    expected_device_kind.cache_clear()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    try:
        assert expected_device_kind("auto") == "cpu"
    finally:
        expected_device_kind.cache_clear()


def test_the_worker_refuses_with_the_same_message(tmp_path):
    """The backstop: a spec that reached a worker anyway ends as a not-supported run, before the
    build, saying what validation says (plus the framework's version)."""
    pytest.importorskip("torch")
    spec = job_spec("torch", "vit", tmp_path, runtime="tensorrt")
    result = run(spec)
    why = refusal(Combination.of(spec, "cpu"), declared()["torch"])
    version = result.tags["framework_version"]
    assert result.error == "NotSupported: " + why.replace("by torch:", f"by torch {version}:")
    assert result.tags["unsupported"] == "true" and "param_count" not in result.metrics


def test_the_refusal_rules_run_once_per_job(tmp_path, monkeypatch):
    """The orchestrator ran them (validate) for the device kind it expected, recorded in the
    spec's refusals_checked: the worker does not run them again; for a spec without it (one
    written by other means, or an unknown kind) the worker does, before the build."""
    pytest.importorskip("torch")
    from fxtrack.config.validate import validate
    from fxtrack.orchestrator.job import job_spec as orchestrator_spec
    from fxtrack.scenarios import rules
    from fxtrack.worker import __main__ as worker
    from test_config import composed

    conf, arch = validate(composed("framework=torch", "model=vit", "size=tiny", "hardware=cpu"))
    spec = orchestrator_spec(conf, arch, tmp_path)
    assert spec.refusals_checked == "cpu"
    calls = []
    monkeypatch.setattr(worker.rules, "refusal", lambda *a, **k: calls.append(a) or None)
    spec.runner = "test_unsupported:no_path"
    assert "unsupported" in run(spec).tags  # it ran on to the runner
    assert calls == []
    spec.refusals_checked = None
    run(spec)
    assert len(calls) == 1 and calls[0][0] == rules.Combination.of(spec, "cpu")


def _runs(cwd):
    """Every run in ``cwd/mlflow.db`` (none when no store was created)."""
    import mlflow

    if not (cwd / "mlflow.db").exists():
        return []
    client = mlflow.MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


@pytest.mark.parametrize("overrides, says", [
    (["framework=tensorflow", "parallel=fsdp", "devices=2"], "use framework=torch or framework=jax"),
    (["runtime=tensorrt", "scenario=train"], "add scenario=inference"),
])
def test_a_single_run_without_a_path_stops_in_one_line_before_any_work(tmp_path, overrides, says):
    pytest.importorskip("mlflow")
    start = time.monotonic()
    proc = run_fxtrack(tmp_path, *overrides, "model=vit", "size=tiny", timeout=120)
    took = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("fxtrack: not supported, nothing was run: ") and says in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert took < 20, f"refused after {took:.0f} s: a worker started?"
    assert _runs(tmp_path) == []  # no run logged


def test_a_sweep_skips_its_cells_without_a_path_and_runs_the_rest(tmp_path):
    """The tensorflow cell is listed up front, never started and never logged; the torch cell
    runs; the closing table shows the skipped one as NOT SUPPORTED; exit status 0."""
    pytest.importorskip("torch")
    pytest.importorskip("mlflow")
    env = seed_peak_cache(tmp_path / "cache")
    proc = run_fxtrack(tmp_path, "-m", "framework=torch,tensorflow", "parallel=fsdp", "devices=2",
                       "hardware=cpu", "model=vit", "size=tiny", "steps=2", "warmup_steps=1",
                       env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    err = proc.stderr
    listed = err.index("fxtrack: 1 of 2 jobs are not supported and will be skipped")
    assert "framework=tensorflow parallel=fsdp" in err[listed:].splitlines()[1]
    assert listed < err.index("job 1/2")  # up front, before any job
    # the closing table: a run's name wraps at its hyphens to fit 100 columns, its status whole
    lines = err.splitlines()
    assert any(line.startswith("tensorflow-") and "NOT SUPPORTED (not run)" in line
               for line in lines), err
    assert any(line.startswith("torch-") and re.search(r"\sFINISHED\s", line) for line in lines), err
    runs = _runs(tmp_path)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert [c.data.tags["fxtrack.framework"] for c in children] == ["torch"]
    assert children[0].info.status == "FINISHED" and parent.info.status == "FINISHED"
    assert "parallel=fsdp is not supported by tensorflow" in parent.data.tags[
        "fxtrack.not_supported"]
