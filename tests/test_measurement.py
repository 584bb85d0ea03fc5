"""Measurement depth through the real CLI: every CPU metric key on a tiny run of each framework
(train and inference), FLOPs/MFU arithmetic, code complexity, the calibration cache, doctor."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

mlflow = pytest.importorskip("mlflow")

from fxtrack.measure import complexity  # noqa: E402
from conftest import all_cores, run_fxtrack  # noqa: E402

FRAMEWORKS = [fw for fw, module in (("torch", "torch"), ("tensorflow", "tensorflow"), ("jax", "jax"))
              if importlib.util.find_spec(module)]
TINY = ["size=tiny", "batch_size=2", "steps=3", "warmup_steps=1", "framework.compile=false"]
COMMON = ["throughput_samples_per_s", "step_time_ms_p50", "step_time_ms_p90", "step_time_ms_p99",
          "step_time_ms_mean", "step_time_ms_std", "step_time_cv", "first_step_time_s", "peak_rss_mib",
          "param_count", "flops_per_sample", "achieved_tflops", "peak_tflops",
          "framework_matmul_tflops", "mfu"]
# the same on every run of a framework: on the sweep's parent and in the report, not on runs
CODE_SIZE = ["code_sloc", "code_lloc", "code_cc", "code_sloc_model"]
GPU_ONLY = ["peak_mem_device_mib", "peak_mem_nvml_mib", "energy_j_per_sample", "power_w_mean"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One sweep: every installed framework x {train, inference} on tiny ViT."""
    cwd = tmp_path_factory.mktemp("measure")
    cache = cwd / "cache"
    proc = run_fxtrack(cwd, "-m", f"framework={','.join(FRAMEWORKS)}", "model=vit",
                       "scenario=train,inference", *TINY, env={"FXTRACK_CACHE": str(cache)})
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
    if run.data.tags.get("fxtrack.peak_contended") == "true":  # a busy machine: no MFU, said so
        assert "mfu" not in m
        expected = [k for k in expected if k != "mfu"]
    stopped = "fxtrack.calibration_stopped" in run.data.tags  # a probe past its time budget
    if stopped:  # (a busy machine): no own rate; MFU against the machine's yardstick where
        # another framework's quiet probe set one
        assert "framework_matmul_tflops" not in m and "own_matmul_share" not in m
        expected = [k for k in expected if k != "framework_matmul_tflops"]
        if "peak_tflops" not in m:
            expected = [k for k in expected if k not in ("mfu", "peak_tflops")]
    assert [k for k in expected if k not in m] == []
    assert [k for k in GPU_ONLY if k in m] == []
    assert [k for k in CODE_SIZE if k in m] == []
    # framework.compile=false: eager torch and op-by-op JAX compile nothing, so no figure; TF
    # still traces its step into a tf.function graph.
    assert ("compile_time_s" in m) == (framework == "tensorflow")
    if "compile_time_s" in m:
        assert m["compile_time_s"] <= m["first_step_time_s"]
    assert m["achieved_tflops"] == pytest.approx(m["flops_per_sample"] * m["throughput_samples_per_s"] / 1e12)
    if "mfu" in m:
        assert 0 < m["mfu"] <= 1
        assert m["mfu"] == pytest.approx(m["achieved_tflops"] / m["peak_tflops"])
    if "fxtrack.peak_tflops_source" in run.data.tags:
        assert run.data.tags["fxtrack.peak_tflops_source"].startswith("machine-best:")
    if not stopped:
        assert run.data.tags["fxtrack.peak_calibrated"][:4].isdigit()  # the calibration's UTC date
        assert m["peak_tflops"] >= m["framework_matmul_tflops"] > 0
    assert run.data.tags["fxtrack.status"] == "ok"


def test_inference_counts_forward_flops_only(sweep):
    runs = sweep[1]
    for fw in FRAMEWORKS:
        train, infer = runs[(fw, "train")], runs[(fw, "inference")]
        assert train.data.metrics["flops_per_sample"] == 3 * infer.data.metrics["flops_per_sample"]
        assert "loss_last" not in infer.data.metrics


def test_every_run_of_a_sweep_measures_against_one_machine_yardstick(sweep):
    """No datasheet on a CPU: MFU's yardstick is the machine's, the fastest matmul rate any
    framework's quiet probe read here (issue 61), named by its source. The sweep probes every
    framework it runs before its first job, so its runs share one yardstick, not one that rose
    as later cells probed their frameworks."""
    runs = list(sweep[1].values())
    peaks = {r.data.metrics.get("peak_tflops") for r in runs} - {None}
    assert len(peaks) == 1, peaks
    [yardstick] = peaks
    # the fastest of the quiet probes (own_matmul_share: logged where the run's own was quiet)
    assert yardstick == max(r.data.metrics["framework_matmul_tflops"] for r in runs
                            if "own_matmul_share" in r.data.metrics)
    sources = {r.data.tags.get("fxtrack.peak_tflops_source") for r in runs} - {None}
    assert len(sources) == 1 and sources.pop().startswith("machine-best:")


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
    if "not cached" in proc.stderr:  # other processes used the cores: refused, and said so
        pytest.skip("the machine was busy during calibration, so nothing was cached to reuse")
    path = cache / "peak_flops.json"
    before = (path.stat().st_mtime_ns, json.loads(path.read_text()))
    again = run_fxtrack(cwd, f"framework={FRAMEWORKS[0]}", "model=vit", *TINY,
                        env={"FXTRACK_CACHE": str(cache)})
    assert again.returncode == 0, again.stderr[-2000:]
    assert "calibrating" not in again.stderr
    assert (path.stat().st_mtime_ns, json.loads(path.read_text())) == before


def test_doctor_lists_every_framework_with_its_version(tmp_path):
    proc = run_fxtrack(tmp_path, "doctor", "--require", ",".join(FRAMEWORKS),
                       env={"FXTRACK_CACHE": str(tmp_path)}, timeout=600)
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
    proc = run_fxtrack(tmp_path, "doctor", "--require", "jax",
                       "--python", f"jax={tmp_path / 'bare' / 'bin' / 'python'}", timeout=600)
    assert proc.returncode == 1
    assert "pip install 'fxtrack[jax]'" in proc.stdout
    assert "required but missing: jax" in proc.stdout


def _fake_trials(monkeypatch, rates, frac=0.0):
    """Replace the probe subprocess: ``rates(fw, call number)`` -> TFLOP/s, None (not installed)
    or "fail"; every trial sees ``frac`` other CPU use. Returns the list of (fw, threads) calls."""
    from fxtrack.orchestrator import calibration

    calls = []

    def trial(fw, python, precision, hardware, threads, deadline_s, timeout_s):
        calls.append((fw, threads))
        rate = rates(fw, len(calls))
        if rate == "fail":
            return None, frac
        return ({"installed": False} if rate is None else {"installed": True, "tflops": rate}), frac

    monkeypatch.setattr(calibration, "_trial", trial)
    monkeypatch.setattr(calibration, "_UNCACHED", {})  # a fresh orchestrator process
    # the three frameworks these rates model (keras is declared too: it calibrates like them)
    monkeypatch.setattr(calibration, "frameworks", lambda: ["jax", "tensorflow", "torch"])
    return calls


def test_a_peak_below_the_achieved_rate_is_measured_again(tmp_path, monkeypatch):
    from fxtrack.orchestrator import calibration

    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    # jax's first probe ran on a busy machine (1 TFLOP/s), its second reads 10; torch is faster
    calls = _fake_trials(monkeypatch, lambda fw, n: {"torch": 20.0, "tensorflow": None,
                                                     "jax": 1.0 if n == 1 else 10.0}[fw])
    pythons = {fw: None for fw in calibration.frameworks()}  # each probed with its configured interpreter
    metrics, tags = calibration.mfu_metrics("jax", "cpu", "fp32", "cpu", 1, 5.0, pythons)
    # one quiet probe of the run's own framework (its worker takes the best of 3 timings);
    # below 5 TFLOP/s, again; torch was never probed, so the machine's yardstick is jax's
    assert [fw for fw, _ in calls] == ["jax", "jax"]
    assert metrics["peak_tflops"] == 10.0 and tags["peak_tflops_source"] == "machine-best:jax"
    assert metrics["framework_matmul_tflops"] == 10.0
    assert metrics["mfu"] == pytest.approx(0.5)
    metrics, _ = calibration.mfu_metrics("jax", "cpu", "fp32", "cpu", 1, 5.0, pythons)
    assert len(calls) == 2  # cached now


def test_calibration_takes_the_best_of_several_trials(tmp_path, monkeypatch):
    from fxtrack.orchestrator import calibration

    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    torch_rates = iter([0.5, 0.9, 0.7])  # torch's trials, whatever order frameworks are probed in
    # a busy machine: each probe is contended, so each is tried again (within the budget)
    _fake_trials(monkeypatch, lambda fw, n: next(torch_rates) if fw == "torch" else None, frac=0.5)
    entries = calibration.calibrate("cpu", "fp32", "cpu", {"torch": None})
    assert entries["torch"]["tflops"] == 0.9 and entries["torch"]["contended"]


def test_a_failed_trial_is_skipped_and_all_failed_is_not_cached(tmp_path, monkeypatch):
    from fxtrack.measure import peak
    from fxtrack.orchestrator import calibration

    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    _fake_trials(monkeypatch, lambda fw, n: "fail" if fw == "jax" or n == 1 else (1.5 if fw == "torch" else None))
    entries = calibration.calibrate("cpu", "fp32", "cpu", {fw: None for fw in calibration.frameworks()})
    assert entries["torch"]["tflops"] == 1.5 and "jax" not in entries
    assert set(next(iter(peak.cached().values()))) == {"torch", "tensorflow"}


def test_a_contended_calibration_serves_the_run_but_is_not_cached(tmp_path, monkeypatch, capsys):
    from fxtrack.measure import peak
    from fxtrack.orchestrator import calibration

    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    calls = _fake_trials(monkeypatch, lambda fw, n: 1.0 if fw == "torch" else None, frac=0.5)
    metrics, tags = calibration.mfu_metrics("torch", "cpu", "fp32", "cpu", 1, 0.5, {"torch": None})
    assert "mfu" not in metrics and metrics["peak_tflops"] == 1.0  # no MFU against a busy peak
    assert tags["peak_contended"] == "true"
    assert tags["peak_calibrated"].endswith("(contended, not cached)")
    assert "not cached" in capsys.readouterr().err
    assert peak.cached() == {}
    calibration.calibrate("cpu", "fp32", "cpu", {"torch": None})
    assert sum(fw == "torch" for fw, _ in calls) == 3  # this process (a sweep) keeps its peak
    monkeypatch.setattr(calibration, "_UNCACHED", {})  # the next fxtrack command
    calibration.calibrate("cpu", "fp32", "cpu", {"torch": None})
    assert sum(fw == "torch" for fw, _ in calls) == 6  # measured again: nothing was cached
    # One quiet trial among busy ones is enough: that one measured the machine.
    _fake_trials(monkeypatch, lambda fw, n: 1.0 if fw == "torch" else None, frac=0.0)
    calibration.calibrate("cpu", "fp32", "cpu", {"torch": None})
    assert next(iter(peak.cached().values()))["torch"]["tflops"] == 1.0


def test_a_gpu_calibration_ignores_host_cpu_load(tmp_path, monkeypatch):
    from fxtrack.measure import peak
    from fxtrack.orchestrator import calibration

    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    _fake_trials(monkeypatch, lambda fw, n: 50.0 if fw == "torch" else None, frac=0.9)
    entries = calibration.calibrate("NVIDIA Unknown X1", "bf16", "gpu", {"torch": None})
    assert not entries["torch"]["contended"] and peak.cached()


def test_framework_missing_is_cached_only_for_its_configured_interpreter(tmp_path, monkeypatch):
    from fxtrack.measure import peak
    from fxtrack.orchestrator import calibration

    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    calls = _fake_trials(monkeypatch, lambda fw, n: 1.0 if fw == "torch" else None)
    # A torch run: TF and JAX probed with this interpreter, which is not theirs as configured
    # (they may live in venvs of their own): their "not installed" is not cached.
    calibration.calibrate("cpu", "fp32", "cpu", {"torch": None})
    assert set(next(iter(peak.cached().values()))) == {"torch"}
    monkeypatch.setattr(calibration, "_UNCACHED", {})  # the next fxtrack command
    calls.clear()
    calibration.calibrate("cpu", "fp32", "cpu", {"jax": "/venvs/jax/bin/python"})
    assert sorted(fw for fw, _ in calls) == ["jax", "tensorflow"]  # torch cached; the others probed
    assert set(next(iter(peak.cached().values()))) == {"torch", "jax"}  # jax: its own interpreter
    calls.clear()
    calibration.calibrate("cpu", "fp32", "cpu", {"jax": "/venvs/jax/bin/python"})
    assert [fw for fw, _ in calls] == []  # cached for that interpreter (and tensorflow's memo)
    calibration.calibrate("cpu", "fp32", "cpu", {"jax": "/venvs/jax-new/bin/python"})
    assert [fw for fw, _ in calls] == ["jax"]  # a "not installed" for another interpreter


def test_the_cache_is_keyed_by_cpu_model_and_threads_not_host(tmp_path, monkeypatch):
    import platform

    from fxtrack.measure import peak
    from fxtrack.orchestrator import calibration

    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    calls = _fake_trials(monkeypatch, lambda fw, n: 1.0 if fw == "torch" else None)
    calibration.calibrate("cpu", "fp32", "cpu", {"torch": None}, threads=1)
    (key,) = peak.cached()
    assert key == f"{peak.cpu_model()}|1 threads|cpu|fp32|probes {peak.PROBES}"
    assert platform.node() not in key.split("|")
    assert {t for _, t in calls} == {1}  # the probe ran on that many cores
    monkeypatch.setattr(platform, "node", lambda: "another-host")
    monkeypatch.setattr(calibration, "_UNCACHED", {})
    n = len(calls)
    calibration.calibrate("cpu", "fp32", "cpu", {"torch": None}, threads=1)
    assert len(calls) == n + 2  # same CPU and threads on another host: torch cached (TF, JAX not)
    if len(peak.cpus()) > 1:
        calibration.calibrate("cpu", "fp32", "cpu", {"torch": None}, threads=2)
        assert len(peak.cached()) == 2


def test_an_old_hostname_keyed_cache_is_ignored(tmp_path, monkeypatch):
    from fxtrack.measure import peak

    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    (tmp_path / "peak_flops.json").write_text(json.dumps({"host|cpu|fp32": {"torch": 9.0}}))
    assert peak.cached() == {}


def test_probe_restricts_the_worker_to_the_thread_count(monkeypatch):
    from fxtrack.measure import peak
    from fxtrack.orchestrator import calibration

    if not hasattr(os, "sched_setaffinity") or len(all_cores()) < 2:
        pytest.skip("needs CPU affinity and two cores")
    seen = {}

    def fake_run(cmd, **kw):
        kw["preexec_fn"]()  # runs in this process here: restore the mask afterwards
        seen["mask"] = os.sched_getaffinity(0)
        return subprocess.CompletedProcess(cmd, 0, stdout='{"installed": false}\n')

    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, all_cores())  # every core the run has, not this worker's share
    monkeypatch.setattr(subprocess, "run", fake_run)
    try:
        assert len(peak.cpus()) >= 2
        assert calibration.ask_worker("matmul", "torch", None, threads=1) == {"installed": False}
    finally:
        os.sched_setaffinity(0, own)
    assert seen["mask"] == {min(all_cores())}


# ---- the step timer ----------------------------------------------------------------------

class FakeClock:
    """time.perf_counter for the timer: each step advances it by the next of ``durations``."""

    def __init__(self, durations):
        self.now, self.durations, self.steps = 0.0, list(durations), 0

    def perf_counter(self):
        return self.now

    def step(self):
        self.now += self.durations[self.steps]
        self.steps += 1
        return self.steps


def _time(monkeypatch, durations, warmup, steps):
    from fxtrack.measure import timer

    clock = FakeClock(durations)
    monkeypatch.setattr(timer.time, "perf_counter", clock.perf_counter)
    return timer.time_steps(clock.step, warmup, steps, show=False)


def test_timer_excludes_warmup_and_takes_throughput_from_the_window(monkeypatch):
    from fxtrack.measure import timer

    times = _time(monkeypatch, [5.0, 1.0, 0.1, 0.2, 0.3, 0.4], warmup=2, steps=4)
    assert times.first_step_time_s == 5.0
    assert times.step_times_s == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert times.window_s == pytest.approx(1.0)
    assert times.loss_handles == [1, 2, 3, 4, 5, 6]
    m = timer.step_metrics(times, global_batch=8, compiled=True)
    assert m["throughput_samples_per_s"] == pytest.approx(8 * 4 / 1.0)
    assert m["step_time_ms_mean"] == pytest.approx(250.0)
    assert m["step_time_ms_p50"] == pytest.approx(250.0)
    assert m["first_step_time_s"] == 5.0
    assert m["compile_time_s"] == pytest.approx(5.0 - 0.25)  # first step - median timed step


def test_percentiles_match_numpy():
    np = pytest.importorskip("numpy")
    from fxtrack.measure.timer import percentile

    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0]
    for q in (0, 10, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_compile_time_is_absent_without_compilation_and_never_negative(monkeypatch):
    from fxtrack.measure import timer

    times = _time(monkeypatch, [0.1, 0.3, 0.3, 0.3], warmup=1, steps=3)
    m = timer.step_metrics(times, 2, compiled=False)
    assert "compile_time_s" not in m and m["first_step_time_s"] == pytest.approx(0.1)
    assert timer.step_metrics(times, 2, compiled=True)["compile_time_s"] == 0.0  # not < 0


def test_zero_warmup_steps_take_the_first_timed_step_as_first_step(monkeypatch):
    from fxtrack.measure import timer

    times = _time(monkeypatch, [2.0, 0.5, 0.5], warmup=0, steps=3)
    assert times.first_step_time_s == 2.0 and len(times.step_times_s) == 3
    m = timer.step_metrics(times, 1, compiled=True)
    assert m["compile_time_s"] == pytest.approx(1.5)
    assert m["throughput_samples_per_s"] == pytest.approx(3 / 3.0)  # the compile step is timed


@pytest.mark.parametrize("framework, compile, expected", [
    ("torch", False, False), ("torch", True, True), ("jax", False, False), ("jax", True, True),
    ("tensorflow", False, True), ("tensorflow", True, True)])
def test_which_runs_log_a_compile_time(framework, compile, expected):
    from types import SimpleNamespace

    from fxtrack.scenarios.timed import compiles

    assert compiles(SimpleNamespace(package=f"fxtrack.frameworks.{framework}",
                                    compile=compile)) is expected


def test_timer_refuses_zero_steps():
    from fxtrack.measure import timer

    with pytest.raises(ValueError):
        timer.time_steps(lambda: None, 1, 0, show=False)
