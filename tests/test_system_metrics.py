"""System metrics (issue 21, item 3): the worker's sampler, MLflow's own names, real timestamps
through to the store, and a real browser on the MLflow UI's run page (slow)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from fxtrack.measure import system
from fxtrack.tracking import records

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model=vit", "size=tiny", "steps=2", "warmup_steps=1", "batch_size=2", "hardware=cpu",
        "hardware.wait_for_idle_s=0"]


def mlflow_names() -> set[str]:
    """The CPU names MLflow's own monitor logs (with the prefix its monitor adds)."""
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor

    monitor = CPUMonitor()
    monitor.collect_metrics()
    return {"system/" + k for k in monitor.metrics}


def test_a_window_shorter_than_the_period_still_has_two_points_under_mlflows_names():
    with system.SystemSampler(period_s=10.0) as s:
        time.sleep(0.05)
    assert set(s.series) == mlflow_names()
    for key, values in s.series.items():
        stamps = s.times_ms[key]
        assert len(values) == len(stamps) == 2, key
        assert stamps[0] < stamps[1] <= time.time() * 1000
    assert 0 < s.series[system.MEMORY_PCT_KEY][0] < 100
    assert s.series[system.MEMORY_MB_KEY][0] > 1.0


def test_the_thread_samples_at_its_period_and_sees_this_process_busy():
    with system.SystemSampler(period_s=0.25) as s:
        # one core busy in a child (this process tree's share, not 0); a spin in this process
        # would hold the GIL the sampler's thread needs to wake on time
        subprocess.run([sys.executable, "-c", "import time\nt = time.monotonic() + 1.3\n"
                        "while time.monotonic() < t: pass"], check=True)
    cpu = s.series[system.CPU_KEY]
    stamps = s.times_ms[system.CPU_KEY]
    # start + the periodic samples (~5; fewer when the machine is busy) + end
    assert 3 <= len(cpu) <= 8, cpu
    assert stamps == sorted(stamps)
    # one busy core of the CPUs this process may use (2 here): well above idle, at most 100
    assert max(cpu[1:]) > 100 / len(s._proc.cpu_affinity()) / 3 and max(cpu) <= 100.5, cpu


def test_gpu_figures_under_mlflows_per_device_names(monkeypatch):
    """A stand-in NVML with two devices; the run computes on CUDA ordinal 1 only."""
    def handle(i):
        return types.SimpleNamespace(i=i)

    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=f"0000000{h.i}:00:00.0"),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=40 + h.i),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=2e9 * (1 + h.i)),
        nvmlDeviceGetPowerUsage=lambda h: 150_000 + h.i)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with system.SystemSampler([1], period_s=10.0) as s:
        pass
    keys = system.gpu_keys(1)
    assert s.series[keys["util"]] == [41.0, 41.0]
    assert s.series[keys["mem"]] == [4000.0, 4000.0]
    assert s.series[keys["power"]] == [150.001, 150.001]
    assert not any("gpu_0" in k for k in s.series)
    # the names MLflow's own GPU monitor uses
    src = (Path(sys.modules["mlflow"].__file__ if "mlflow" in sys.modules else
                __import__("mlflow").__file__).parent / "system_metrics/metrics/gpu_monitor.py")
    for suffix in ("utilization_percentage", "memory_usage_megabytes", "power_usage_watts"):
        assert f'f"gpu_{{i}}_{suffix}"' in src.read_text()


def test_stamped_series_keep_their_times_and_the_others_are_derived_from_the_steps():
    series = {"step_time_ms": [100.0, 50.0], "loss": [2.0, 1.0], system.CPU_KEY: [10.0, 20.0]}
    times = records.series_times(series, 10_000, {system.CPU_KEY: [9_000, 9_500]})
    assert times["step_time_ms"] == times["loss"] == [9_950, 10_000]
    assert times[system.CPU_KEY] == [9_000, 9_500]
    assert records.series_times(series, 10_000)[system.CPU_KEY] == [9_950, 10_000]  # old records


def test_the_sampler_thread_is_gone_after_the_window():
    with system.SystemSampler(period_s=0.05):
        time.sleep(0.12)
    assert not [t for t in threading.enumerate() if t.name == "fxtrack-system-metrics"]


# --- a real run, through the writer into a store ---------------------------------------------

@pytest.fixture(scope="module")
def store(tmp_path_factory):
    pytest.importorskip("torch")
    from conftest import run_fxtrack, seed_peak_cache

    cwd = tmp_path_factory.mktemp("sysmetrics")
    # 12 steps of batch 2: a window of a second or so on this machine, so the thread samples too
    proc = run_fxtrack(cwd, "framework=torch", *[a for a in TINY if not a.startswith("steps=")],
                       "steps=12", env=seed_peak_cache(cwd / "cache"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd


def test_a_runs_system_metrics_have_real_increasing_timestamps_and_sample_steps(store):
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    exp = client.get_experiment_by_name("fxtrack")
    (run,) = [r for r in client.search_runs([exp.experiment_id])
              if r.data.tags.get("fxtrack.framework") == "torch"]
    logged = {k for k in run.data.metrics if k.startswith("system/")}
    assert logged == mlflow_names()
    steps = client.get_metric_history(run.info.run_id, "step_time_ms")
    for key in logged:
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        assert [m.step for m in history] == list(range(len(history))) and len(history) >= 2
        stamps = [m.timestamp for m in history]
        assert stamps == sorted(stamps) and stamps[-1] > stamps[0], (key, stamps)
        # inside the run, and around the timed steps (they were stamped by the worker's clock)
        assert run.info.start_time <= stamps[0] <= min(m.timestamp for m in steps) + 50
        assert stamps[-1] <= run.info.end_time


# --- a real browser on the MLflow UI -----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="needs Debian's chromium on PATH (apt-get install chromium)")
def test_the_mlflow_ui_shows_the_run_and_its_system_metrics_in_a_real_browser(store, tmp_path):
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import mlflow_ui_shots
    finally:
        sys.path.remove(str(ROOT / "docs"))
    charted = [key.removeprefix("system/") for key in mlflow_names()]
    shots = mlflow_ui_shots.photograph(f"sqlite:///{store / 'mlflow.db'}", tmp_path, cwd=store,
                                       pages=("run", "system-metrics"),
                                       expect={"system-metrics": charted})
    run_name = shots["run_name"]
    for page in ("run", "system-metrics"):
        png, dom = shots[page]
        assert not mlflow_ui_shots.blank(png), f"{png} is blank"
        assert run_name in dom, f"the {page} page does not name the run {run_name}"
    _, dom = shots["system-metrics"]
    # the tab's charts, one per metric, titled without the system/ prefix the UI groups by
    for key in sorted(mlflow_names()):
        assert key.removeprefix("system/") in dom, f"{key} is not charted on the System metrics tab"
