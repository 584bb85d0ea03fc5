"""Data parallelism on CPU devices, the scaling scenario, and sweeps through the joblib launcher."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")

from fxtrack.orchestrator.runner import worker_command  # noqa: E402
from fxtrack.scenarios.scaling.driver import device_counts, scaling_metrics  # noqa: E402
from conftest import job_spec, run_fxtrack  # noqa: E402

TINY = ["size=tiny", "batch_size=2", "steps=3", "warmup_steps=1", "framework.compile=false"]
FRAMEWORKS = [fw for fw, module in (("torch", "torch"), ("tensorflow", "tensorflow"), ("jax", "jax"))
              if importlib.util.find_spec(module)]


def runs(cwd: Path) -> list:
    client = mlflow.MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    return client.search_runs([client.get_experiment_by_name("fxtrack").experiment_id])


def test_device_counts_double_up_to_devices():
    assert device_counts(1) == [1]
    assert device_counts(2) == [1, 2]
    assert device_counts(8) == [1, 2, 4, 8]
    assert device_counts(6) == [1, 2, 4, 6]


def test_scaling_metrics_arithmetic():
    m = scaling_metrics({1: 100.0, 2: 180.0, 4: 300.0})
    assert m["speedup_x2"] == pytest.approx(1.8) and m["scaling_efficiency_x2"] == pytest.approx(0.9)
    assert m["scaling_efficiency_x4"] == pytest.approx(0.75) == m["scaling_efficiency"]
    assert scaling_metrics({2: 10.0}) == {}  # no single-device baseline, no efficiency


def test_torchrun_launch_commands(tmp_path):
    spec = job_spec("torch", "vit", launcher="torchrun", devices=4)
    cmd = worker_command(spec, "py", tmp_path / "spec.json")
    assert cmd[:5] == ["py", "-m", "fxtrack.frameworks.torch.launch", "--nproc-per-node=4",
                       "--standalone"]
    spec = job_spec("torch", "vit", launcher="torchrun", devices=2, nodes=2, node_rank=1,
                        coordinator="10.1.2.3:29500")
    cmd = worker_command(spec, "py", tmp_path / "spec.json")
    assert "--nnodes=2" in cmd and "--node-rank=1" in cmd and "--master-addr=10.1.2.3" in cmd
    assert cmd[-3:] == ["-m", "fxtrack.worker", str(tmp_path / "spec.json")]
    assert worker_command(job_spec("jax", "vit", devices=4), "py", tmp_path / "s.json") == [
        "py", "-m", "fxtrack.worker", str(tmp_path / "s.json")]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_scaling_scenario_gives_a_parent_with_x1_and_x2(tmp_path, framework):
    proc = run_fxtrack(tmp_path, "scenario=scaling", f"framework={framework}", "hardware=cpu",
                       "devices=2", *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    all_runs = runs(tmp_path)
    (parent,) = [r for r in all_runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in all_runs if "mlflow.parentRunId" in r.data.tags]
    suffix = "tiny-b2-s3-compile_false"  # what TINY changes from the defaults
    assert parent.info.run_name == f"{framework}-vit-scaling-fp32-x2-{suffix}"
    assert parent.info.status == "FINISHED"
    assert sorted(c.info.run_name for c in children) == [
        f"{framework}-vit-scaling-fp32-x1-{suffix}", f"{framework}-vit-scaling-fp32-x2-{suffix}"]
    assert all(c.info.status == "FINISHED" for c in children)
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    by_devices = {c.data.params["devices"]: c.data.metrics["throughput_samples_per_s"] for c in children}
    m = parent.data.metrics
    assert m["speedup_x2"] == pytest.approx(by_devices["2"] / by_devices["1"])
    assert m["scaling_efficiency_x2"] == pytest.approx(by_devices["2"] / (2 * by_devices["1"]))
    assert m["scaling_efficiency"] == m["scaling_efficiency_x2"]
    assert m["scaling_efficiency_x1"] == pytest.approx(1.0)


@pytest.mark.skipif(not importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher"),
                    reason="hydra-joblib-launcher not installed")
def test_two_job_sweep_through_the_joblib_launcher(tmp_path):
    proc = run_fxtrack(tmp_path, "-m", "hydra/launcher=local_parallel", "framework=torch",
                       "model=vit", "seed=0,1", *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    all_runs = runs(tmp_path)
    (parent,) = [r for r in all_runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in all_runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 2 and all(c.info.status == "FINISHED" for c in children)
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert "Joblib.Parallel(n_jobs=2" in proc.stdout  # Hydra logs the launcher to stdout
