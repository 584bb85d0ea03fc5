"""The GPU conditions rules (fxtrack/measure/gpu_conditions.py) driven by a fake NVML: foreign
processes before and during the window under hardware.gpu_isolation, the double-listed process,
the condition tags, throttling, a MIG device, NVML missing; a CPU run left unchanged; and a whole
timed run on a fake GPU, where each rule reaches the Result (contended, throttled, error before
the build, the memory readings and their kinds)."""

from __future__ import annotations

import os
import sys
import time
import types

import pytest

from fxtrack.measure import gpu_conditions as gc
from fxtrack.measure import nvml
from fxtrack.measure.system import SystemSampler
from fxtrack.scenarios import timed
from tests.fake_nvml import FakeNvml, MissingNvml, gpu

# NVML index order is not PCI order: CUDA 0 = NVML 1, CUDA 1 = NVML 0, CUDA 2 = NVML 2
DEVICES = [("00000000:3B:00.0", "GPU-bbbb"), ("00000000:1A:00.0", "GPU-aaaa"),
           ("00000000:5E:00.0", "GPU-cccc")]


@pytest.fixture
def fake(monkeypatch):
    fake = FakeNvml([gpu(bus, uuid) for bus, uuid in DEVICES])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(nvml, "SAMPLE_PERIOD_S", 0.001)
    return fake


def window(ordinals=(0,)):
    return nvml.NvmlWindow(list(ordinals), list(ordinals))


def test_a_foreign_process_that_appears_mid_window_is_tagged(fake):
    me = os.getpid()
    fake.devices[1]["compute"] = {me: 2**30}  # CUDA 0 is NVML 1

    def arrive(f):
        f.devices[1]["compute"][4242] = 3 * 2**30

    fake.on_sample.append((3, arrive))
    with window() as w:
        time.sleep(0.05)
    tags = w.tags()
    assert tags["gpu_foreign_processes"] == "4242:3072MiB"  # the run's own pid left out


def test_a_process_on_another_gpu_is_not_the_runs_concern(fake):
    fake.devices[0]["compute"] = {4242: 2**30}  # NVML 0 = CUDA 1, which the run does not use
    with window([0]) as w:
        time.sleep(0.01)
    assert "gpu_foreign_processes" not in w.tags()


def test_a_process_in_both_lists_counts_once(fake):
    fake.devices[1]["compute"] = {77: 2**30}
    fake.devices[1]["graphics"] = {77: 2**30}
    assert gc.foreign(fake, [1], set()) == {77: 2**30}
    assert gc.describe(gc.foreign(fake, [1], set())) == "77:1024MiB"


@pytest.mark.parametrize("isolation", ["warn", "error", "wait"])
def test_isolation_rules_before_any_work(fake, isolation):
    fake.devices[1]["compute"] = {4242: 2**30}
    said = []
    if isolation == "error":
        with pytest.raises(RuntimeError, match="gpu_isolation=error.*4242"):
            nvml.check_before([0], isolation, 0.0, said.append)
        return
    if isolation == "wait":  # the other process ends while fxtrack waits
        fake.on_sample.append((2, lambda f: f.devices[1]["compute"].clear()))
        assert nvml.check_before([0], "wait", 5.0, said.append) == {}
        assert "waiting up to 5 s" in said[0]
        return
    assert nvml.check_before([0], "warn", 0.0, said.append) == {
        "gpu_foreign_processes_before": "4242:1024MiB"}
    assert "WARNING" in said[0]


def test_wait_gives_up_after_wait_for_idle_s_and_tags(fake, monkeypatch):
    monkeypatch.setattr(gc, "POLL_S", 0.01)
    fake.devices[1]["compute"] = {4242: 2**30}
    t0 = time.monotonic()
    tags = nvml.check_before([0], "wait", 0.1, lambda s: None)
    assert time.monotonic() - t0 >= 0.1  # it waited, then gave up (a hang is the timeout's to catch)
    assert tags == {"gpu_foreign_processes_before": "4242:1024MiB"}


def test_an_unknown_isolation_is_refused():
    with pytest.raises(ValueError, match="gpu_isolation"):
        nvml.check_before([0], "kill", 0.0)


def test_conditions_are_tagged_per_used_gpu_by_cuda_ordinal(fake):
    fake.devices[1].update(temperature=41, persistence=0, power_limit_mw=500_000)
    fake.on_sample.append((2, lambda f: f.devices[1].update(temperature=63)))
    with window() as w:
        time.sleep(0.05)
    tags = w.tags()
    assert tags["gpu.driver_version"] == "570.86.15" and tags["gpu.cuda_driver_version"] == "12.8"
    assert tags["gpu.0.bus_id"] == "00000000:1A:00.0"  # CUDA 0, not NVML 0
    assert tags["gpu.0.name"] == "NVIDIA H200"
    assert tags["gpu.0.persistence_mode"] == "disabled"
    assert tags["gpu.0.power_limit_w"] == "500" and tags["gpu.0.power_limit_default_w"] == "700"
    assert tags["gpu.0.mig_mode"] == "disabled" and tags["gpu.0.ecc_mode"] == "enabled"
    assert tags["gpu.0.applications_clock_sm_mhz"] == "1980"
    assert tags["gpu.0.sm_clock_mhz"] == "1980" and tags["gpu.0.mem_clock_mhz"] == "3201"
    assert tags["gpu.0.temperature_start_c"] == "41" and tags["gpu.0.temperature_end_c"] == "63"
    assert tags["gpu.clock_event_reasons"] == "none" and "gpu_throttled" not in tags
    assert not any(k.startswith("gpu.1.") for k in tags)


def test_clocks_that_throttle_mid_window_tag_the_reasons(fake):
    def throttle(f):
        f.devices[1].update(reasons=0x4 | 0x40 | 0x1, clock={1: 1410, 2: 3201})

    fake.on_sample.append((3, throttle))
    with window() as w:
        time.sleep(0.05)
    tags = w.tags()
    assert tags["gpu_throttled"] == "hw_thermal_slowdown,sw_power_cap"
    assert "gpu_idle" in tags["gpu.clock_event_reasons"]  # seen, but not throttling
    assert tags["gpu.0.sm_clock_mhz"] == "1410-1980"


def test_an_unsupported_reading_is_left_out_not_guessed(fake):
    fake.devices[1]["ecc"] = RuntimeError("NVML_ERROR_NOT_SUPPORTED")
    fake.devices[1]["reasons"] = RuntimeError("NVML_ERROR_NOT_SUPPORTED")
    with window() as w:
        pass
    tags = w.tags()
    assert "gpu.0.ecc_mode" not in tags and tags["gpu.clock_event_reasons"] == "none"
    assert tags["gpu.0.name"] == "NVIDIA H200"


def test_a_mig_device(fake, monkeypatch):
    fake.devices[1]["mig"] = (1, 1)
    with window() as w:
        pass
    assert w.tags()["gpu.0.mig_mode"] == "enabled"
    # a MIG instance named by CUDA_VISIBLE_DEVICES cannot be mapped: one tag says so
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-1234-5678")
    with window() as w:
        pass
    assert w.tags() == {"gpu.nvml": gc.UNMAPPED}
    assert nvml.check_before([0], "error", 0.0) == {"gpu.nvml": gc.UNMAPPED}


def test_nvml_missing_degrades_to_a_tag(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", MissingNvml())
    with window() as w:
        pass
    assert w.tags()["gpu.nvml"].startswith("unavailable: RuntimeError: NVML Shared Library")
    assert w.metrics(10) == {}
    assert nvml.check_before([0], "error", 0.0)["gpu.nvml"].startswith("unavailable")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed at all: ImportError
    assert nvml.check_before([0], "warn", 0.0)["gpu.nvml"].startswith("unavailable: ModuleNotFoundError")


def test_system_metrics_cover_only_the_used_gpus_under_their_cuda_ordinals(fake):
    fake.devices[1]["util"], fake.devices[0]["util"], fake.devices[2]["util"] = 91, 55, 7
    sampler = SystemSampler([0, 1])
    sampler.sample()
    gpus = sorted(k for k in sampler.series if k.startswith("system/gpu_"))
    assert gpus == ["system/gpu_0_memory_usage_megabytes", "system/gpu_0_power_usage_watts",
                    "system/gpu_0_utilization_percentage", "system/gpu_1_memory_usage_megabytes",
                    "system/gpu_1_power_usage_watts", "system/gpu_1_utilization_percentage"]
    # CUDA 0 is NVML 1 (util 91), CUDA 1 is NVML 0 (55); NVML 2, a neighbour's, is not read
    assert sampler.series["system/gpu_0_utilization_percentage"] == [91.0]
    assert sampler.series["system/gpu_1_utilization_percentage"] == [55.0]


def _spec(**kw):
    base = dict(devices=1, wait_for_idle_s=0.0, cpu_threads=None, progress=False,
                framework="fake", arch={"name": "mlp"}, gpu_isolation="warn")
    return types.SimpleNamespace(**{**base, **kw})


def test_the_timed_window_on_a_gpu_reads_the_conditions(fake, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    fake.on_sample.append((2, lambda f: f.devices[1]["compute"].update({999: 2**20})))
    _, window, _, _, _ = timed.timed_window(_spec(), "gpu", lambda: time.sleep(0.002), 1, 5)
    tags = window.tags()
    assert tags["gpu.0.name"] == "NVIDIA H200" and tags["gpu_foreign_processes"] == "999:1MiB"


def test_a_cpu_run_is_unchanged(fake):
    _, window, _, _, system = timed.timed_window(_spec(), "cpu", lambda: None, 1, 3)
    assert window.tags() == {} and window.metrics(3) == {}
    assert not any(k.startswith("system/gpu_") for k in system.series)
    assert fake.samples == 0  # NVML never asked


def test_the_summary_line_says_a_gpu_run_was_shared_or_throttled():
    from fxtrack.worker.protocol import Result
    from fxtrack.tracking.records import summary_line

    r = Result("r", status="FINISHED", metrics={"throughput_samples_per_s": 10.0},
               tags={"gpu_foreign_processes": "4242:1024MiB", "gpu_throttled": "sw_power_cap"})
    line = summary_line("torch-resnet50", r)
    assert "CONTENDED: other processes on the run's GPUs (4242:1024MiB)" in line
    assert "THROTTLED: the GPU slowed its clocks (sw_power_cap)" in line
    assert "CONTENDED" not in summary_line("x", Result("r", status="FINISHED"))


def test_the_report_marks_a_throttled_run_as_it_marks_a_contended_one():
    import pandas as pd

    from fxtrack.report.select import latest_runs

    base = {"status": "FINISHED", "start_time": pd.Timestamp("2026-12-01"),
            "end_time": pd.Timestamp("2026-12-01"),
            "tags.fxtrack.framework": "torch", "tags.fxtrack.model": "resnet50",
            "tags.fxtrack.scenario": "train", "tags.fxtrack.precision": "bf16",
            "tags.fxtrack.devices": "1", "tags.fxtrack.hardware": "gpu",
            "tags.fxtrack.contended": "false", "metrics.throughput_samples_per_s": 100.0}
    frame = pd.DataFrame([{**base, "run_id": "a", "tags.fxtrack.gpu_throttled": "hw_slowdown"},
                          {**base, "run_id": "b", "tags.fxtrack.model": "vit",
                           "tags.fxtrack.gpu_throttled": None}])
    runs = latest_runs(frame).runs.set_index("model")
    assert runs.loc["resnet50", "contended"] == "true" and runs.loc["vit", "contended"] == "false"


def test_gpu_isolation_composes_with_warn_by_default_and_refuses_other_values():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from fxtrack.cli import CONF_DIR
    from fxtrack.config import register

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        assert compose(config_name="config").hardware.gpu_isolation == "warn"
        bad = compose(config_name="config", overrides=["hardware=gpu", "hardware.gpu_isolation=kill"])
    with pytest.raises(Exception, match="gpu_isolation must be warn, error or wait"):
        OmegaConf.to_object(bad.hardware)


# ---- a whole timed run on a fake GPU: the rules reach the Result ------------------------------

@pytest.fixture
def gpu_run(fake, monkeypatch, tmp_path):
    """run_timed on a stand-in GPU backend (tests/test_load.py's, on "gpu"), the host's CPU load
    held quiet so that only the GPU's conditions can mark the run contended."""
    from conftest import job_spec
    from fxtrack.frameworks.base import PeakMemory
    from fxtrack.worker.protocol import Result
    from fxtrack.measure import host_load
    from tests.test_load import SpinBackend

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))  # the tuned-compile cache
    monkeypatch.setattr(host_load, "window_figures", lambda before, during: ({}, False))

    class GpuBackend(SpinBackend):
        built = 0

        def device_kind(self):
            return "gpu"

        def device_tags(self):
            return {"device": "NVIDIA H200"}

        def build(self, batch_size):
            GpuBackend.built += 1

        def peak_memory(self):
            return PeakMemory("torch.max_memory_allocated", 2**30, "torch.max_memory_reserved",
                              2 * 2**30)

    def run(isolation="warn"):
        spec = job_spec("torch", "vit", tmp_path, hardware="gpu", steps=6, warmup_steps=1,
                        gpu_isolation=isolation)
        result, backend = Result(spec.result_id), GpuBackend(spec, step_s=0.01)
        timed.run_timed(backend, result, lambda: backend.train_step, 1)
        return result

    run.backend = GpuBackend
    return run


def test_a_gpu_run_shared_mid_window_is_contended_and_its_throttling_tagged(fake, gpu_run):
    def arrive_and_throttle(f):
        f.devices[1]["compute"][4242] = 2**30  # CUDA 0 is NVML 1
        f.devices[1]["reasons"] = 0x4  # sw_power_cap

    fake.on_sample.append((4, arrive_and_throttle))
    result = gpu_run()
    tags, m = result.tags, result.metrics
    assert tags["gpu_foreign_processes"] == "4242:1024MiB" and tags["contended"] == "true"
    assert "gpu_foreign_processes_before" not in tags  # it came after the pre-check
    assert tags["gpu_throttled"] == "sw_power_cap" and tags["gpu.0.name"] == "NVIDIA H200"
    assert m["peak_mem_device_mib"] == 1024 and m["peak_mem_device_reserved_mib"] == 2048
    assert tags["peak_mem_device_kind"] == "torch.max_memory_allocated"
    assert tags["peak_mem_device_reserved_kind"] == "torch.max_memory_reserved"


def test_a_quiet_unthrottled_gpu_run_is_not_contended(fake, gpu_run):
    result = gpu_run()
    assert result.tags["contended"] == "false"
    assert not {"gpu_foreign_processes", "gpu_throttled"} & set(result.tags)


def test_gpu_isolation_error_fails_before_the_build(fake, gpu_run):
    fake.devices[1]["compute"] = {4242: 2**30}
    gpu_run.backend.built = 0
    with pytest.raises(RuntimeError, match="gpu_isolation=error.*4242"):
        gpu_run("error")
    assert gpu_run.backend.built == 0  # no work was done


def test_a_process_in_both_lists_is_tagged_once_through_the_window(fake):
    fake.devices[1]["compute"] = {77: 2**30}
    fake.devices[1]["graphics"] = {77: 2**30}
    with window() as w:
        time.sleep(0.01)
    assert w.tags()["gpu_foreign_processes"] == "77:1024MiB"  # once, its memory not doubled
