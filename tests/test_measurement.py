"""Measurement depth through the real CLI: every CPU metric key on a tiny run of each framework
(train and inference), FLOPs/MFU arithmetic, code complexity, the calibration cache, doctor."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")

from fxtrack.measure import complexity  # noqa: E402

FRAMEWORKS = [fw for fw, module in (("torch", "torch"), ("tensorflow", "tensorflow"), ("jax", "jax"))
              if importlib.util.find_spec(module)]
TINY = ["size=tiny", "batch_size=2", "steps=3", "warmup_steps=1", "framework.compile=false"]
COMMON = ["throughput_samples_per_s", "step_time_ms_p50", "step_time_ms_p90", "step_time_ms_p99",
          "step_time_ms_mean", "step_time_ms_std", "step_time_cv", "compile_time_s", "peak_rss_mib",
          "param_count", "flops_per_sample", "achieved_tflops", "peak_tflops",
          "framework_matmul_tflops", "mfu", "code_sloc", "code_lloc", "code_cc",
          "code_sloc_model", "code_sloc_train", "code_sloc_data", "code_sloc_devices"]
GPU_ONLY = ["peak_mem_device_mib", "peak_mem_nvml_mib", "energy_j_per_sample", "power_w_mean"]


def fxtrack(cwd: Path, *args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(FXTRACK_HOME=str(cwd / "home"), FXTRACK_CACHE=str(cache))
    return subprocess.run([sys.executable, "-m", "fxtrack", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1200)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One sweep: every installed framework x {train, inference} on tiny ViT."""
    cwd = tmp_path_factory.mktemp("measure")
    cache = cwd / "cache"
    proc = fxtrack(cwd, "-m", f"framework={','.join(FRAMEWORKS)}", "model=vit",
                   "scenario=train,inference", *TINY, cache=cache)
    client = mlflow.MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    exp = client.get_experiment_by_name("fxtrack")
    runs = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
    return proc, {(r.data.tags["fxtrack.framework"], r.data.tags["fxtrack.scenario"]): r for r in runs}, cwd, cache


def test_sweep_finished(sweep):
    proc, runs, _, _ = sweep
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(runs) == 2 * len(FRAMEWORKS)
    assert all(r.info.status == "FINISHED" for r in runs.values())


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("scenario", ["train", "inference"])
def test_every_cpu_metric_is_logged_and_gpu_ones_are_absent(sweep, framework, scenario):
    run = sweep[1][(framework, scenario)]
    m = run.data.metrics
    expected = COMMON + (["loss_first", "loss_last"] if scenario == "train" else [])
    assert [k for k in expected if k not in m] == []
    assert [k for k in GPU_ONLY if k in m] == []
    assert m["achieved_tflops"] == pytest.approx(m["flops_per_sample"] * m["throughput_samples_per_s"] / 1e12)
    assert 0 < m["mfu"] <= 1
    assert m["mfu"] == pytest.approx(m["achieved_tflops"] / m["peak_tflops"])
    assert run.data.tags["fxtrack.peak_tflops_source"].startswith("measured:")
    assert m["peak_tflops"] >= m["framework_matmul_tflops"] > 0
    assert run.data.tags["fxtrack.status"] == "ok"


def test_inference_counts_forward_flops_only(sweep):
    runs = sweep[1]
    for fw in FRAMEWORKS:
        train, infer = runs[(fw, "train")], runs[(fw, "inference")]
        assert train.data.metrics["flops_per_sample"] == 3 * infer.data.metrics["flops_per_sample"]
        assert "loss_last" not in infer.data.metrics


def test_peak_is_the_same_for_every_framework(sweep):
    peaks = {r.data.metrics["peak_tflops"] for r in sweep[1].values()}
    assert len(peaks) == 1


def test_code_complexity_is_positive_and_differs_between_frameworks():
    counts = {fw: complexity.code_metrics(fw) for fw in FRAMEWORKS}
    for fw, m in counts.items():
        assert m["code_sloc"] > m["code_sloc_model"] > 0 and m["code_lloc"] > 0 and m["code_cc"] > 0
        assert m["code_sloc"] >= sum(v for k, v in m.items() if k.startswith("code_sloc_"))
    if len(counts) > 1:
        assert len({m["code_sloc_model"] for m in counts.values()}) == len(counts)


def test_calibration_cache_is_reused_on_the_second_run(sweep):
    proc, _, cwd, cache = sweep
    assert "calibrating peak FLOP/s" in proc.stderr
    path = cache / "peak_flops.json"
    before = (path.stat().st_mtime_ns, json.loads(path.read_text()))
    again = fxtrack(cwd, f"framework={FRAMEWORKS[0]}", "model=vit", *TINY, cache=cache)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "calibrating" not in again.stderr
    assert (path.stat().st_mtime_ns, json.loads(path.read_text())) == before


def test_doctor_lists_every_framework_with_its_version(tmp_path):
    env = dict(os.environ, FXTRACK_CACHE=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "fxtrack", "doctor", "--require",
                           ",".join(FRAMEWORKS)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for fw in ("torch", "tensorflow", "jax"):
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(fw))
        if fw in FRAMEWORKS:
            version = subprocess.run([sys.executable, "-c", f"import {fw}; print({fw}.__version__)"],
                                     capture_output=True, text=True).stdout.strip()
            assert version in line and "devices: cpu" in line.lower()
    assert "NVML:" in proc.stdout and "tracking:" in proc.stdout


def test_doctor_require_fails_for_a_missing_framework(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    proc = subprocess.run([sys.executable, "-m", "fxtrack", "doctor", "--require", "jax",
                           "--python", f"jax={tmp_path / 'bare' / 'bin' / 'python'}"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 1
    assert "pip install 'fxtrack[jax]'" in proc.stdout
    assert "required but missing: jax" in proc.stdout


def test_a_peak_below_the_achieved_rate_is_measured_again(tmp_path, monkeypatch):
    from fxtrack.measure import peak

    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    calls = []

    def fake_measure(fw, python, precision, hardware):
        calls.append(fw)
        rate = {"torch": 2.0, "tensorflow": None, "jax": 1.0}[fw]  # TF: not installed
        return rate and rate * (10 if len(calls) > 3 else 1)  # the second calibration is quiet

    monkeypatch.setattr(peak, "_measure", fake_measure)
    metrics, source = peak.mfu_metrics("jax", "cpu", "fp32", "cpu", 1, 5.0, {})
    assert len(calls) == 6  # measured, found below 5 TFLOP/s, measured again
    assert metrics["peak_tflops"] == 20.0 and source == "measured:torch"
    assert metrics["framework_matmul_tflops"] == 10.0
    assert metrics["mfu"] == pytest.approx(0.25)
    metrics, _ = peak.mfu_metrics("jax", "cpu", "fp32", "cpu", 1, 5.0, {})
    assert len(calls) == 6  # cached now


def test_known_gpus_use_their_datasheet_peak():
    from fxtrack.measure import peak

    assert peak.datasheet("NVIDIA H200", "bf16") == (989.5, "datasheet:H200")
    assert peak.datasheet("NVIDIA H100 PCIe", "bf16") == (756.0, "datasheet:H100 PCIe")
    assert peak.datasheet("NVIDIA A100-SXM4-80GB", "fp32") == (19.5, "datasheet:A100")
    assert peak.datasheet("cpu", "bf16") is None
