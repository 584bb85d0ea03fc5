"""Peak FLOP/s calibration (fxtrack.orchestrator.calibration): the frameworks it asks are the ones
the config directories declare, a worker without the capability gives no calibration,
concurrent runs merging into the one cache file keep each other's entries, the probe's size
follows the device (fxtrack.measure.matmul_probe), the time budget stops a slow probe, and
native-precision detection (fxtrack.measure.peak.native_precision)."""

from __future__ import annotations

import json
import multiprocessing
import textwrap
import time

import pytest

from fxtrack.measure import matmul_probe, peak
from fxtrack.orchestrator import calibration

ENTRY = {"tflops": 1.0, "date": "2026-01-01T00:00:00Z", "contended": False, "other_cpu_frac": 0.0}


def _write_keys(cache_dir: str, prefix: str, count: int) -> None:
    """One process calibrating ``count`` devices one after another, as a sweep would."""
    import os

    os.environ["FXTRACK_CACHE"] = cache_dir
    for i in range(count):
        assert calibration.store(f"{prefix}{i}", {"torch": dict(ENTRY)})


def test_concurrent_cache_writes_keep_every_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters, like two fxtrack commands
    procs = [ctx.Process(target=_write_keys, args=(str(tmp_path), prefix, 200))
             for prefix in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    assert set(peak.cached()) == {f"{prefix}{i}" for prefix in "ab" for i in range(200)}


def test_store_merges_into_a_key_unless_told_to_replace_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    calibration.store("k", {"torch": ENTRY})
    calibration.store("k", {"jax": ENTRY})
    assert set(peak.cached()["k"]) == {"torch", "jax"}
    calibration.store("k", {"tensorflow": ENTRY}, replace=True)  # a refresh
    assert set(peak.cached()["k"]) == {"tensorflow"}


def test_frameworks_are_the_declared_configs_the_users_included(tmp_path, monkeypatch):
    assert {"jax", "tensorflow", "torch", "keras"} <= set(calibration.frameworks())
    (tmp_path / "framework").mkdir()
    (tmp_path / "framework" / "mine.yaml").write_text("name: mine\npackage: mypkg.fw\n")
    (tmp_path / "framework" / "torch.yaml").write_text("name: torch\npackage: mypkg.torch\n")
    monkeypatch.setenv("FXTRACK_CONFIG_DIR", str(tmp_path))
    assert calibration.frameworks()[-1] == "mine"  # the user's after fxtrack's own
    # the probe names the framework's code by the YAML's package
    assert calibration.framework_package("mine") == "mypkg.fw"
    assert calibration.framework_package("jax") == "fxtrack.frameworks.jax"
    # fxtrack's own config comes first, as in Hydra's search path
    assert calibration.framework_package("torch") == "fxtrack.frameworks.torch"
    with pytest.raises(FileNotFoundError):
        calibration.framework_package("nonesuch")


def test_a_framework_without_calibration_is_neither_a_failure_nor_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    monkeypatch.setattr(calibration, "_UNCACHED", {})
    monkeypatch.setattr(calibration, "frameworks", lambda: ["torch", "keras"])
    calls = []

    def trial(fw, python, precision, hardware, threads, deadline_s, timeout_s):
        calls.append(fw)
        if fw == "keras":
            return {"installed": True, "supported": False, "reason": "no matmul probe"}, 0.0
        return {"installed": True, "tflops": 2.0}, 0.0

    monkeypatch.setattr(calibration, "_trial", trial)
    pythons = {"torch": None, "keras": None}
    metrics, tags = calibration.mfu_metrics("keras", "cpu", "fp32", "cpu", 1, 0.5, pythons)
    assert calls == ["keras"]  # one answer says it all: no further trials, no other framework
    # no rate of its own and none of another framework's yet: no yardstick, no MFU
    assert metrics == {} and "peak_tflops_source" not in tags
    assert not (tmp_path / "peak_flops.json").exists()
    metrics, tags = calibration.mfu_metrics("torch", "cpu", "fp32", "cpu", 1, 0.5, pythons)
    assert metrics["mfu"] == pytest.approx(0.25) and tags["peak_tflops_source"] == "machine-best:torch"
    assert set(json.loads((tmp_path / "peak_flops.json").read_text()).popitem()[1]) == {"torch"}
    calibration.calibrate("cpu", "fp32", "cpu", pythons)
    assert calls.count("keras") == 1  # this process remembers it; the cache does not hold it
    monkeypatch.setattr(calibration, "_UNCACHED", {})  # the next fxtrack command asks again
    calibration.calibrate("cpu", "fp32", "cpu", pythons)
    assert calls.count("keras") == 2 and calls.count("torch") == 1  # one quiet probe: final


def _trials(monkeypatch, rates: dict, frac: float):
    """Probes answering ``rates[fw]`` TFLOP/s while other processes take ``frac`` of the cores."""
    monkeypatch.setattr(calibration, "_UNCACHED", {})
    monkeypatch.setattr(calibration, "_trial", lambda fw, *a: (
        {"installed": True, "tflops": rates[fw]} if fw in rates else {"installed": False}, frac))


def test_a_contended_peak_gives_no_mfu_and_the_run_says_why(tmp_path, monkeypatch):
    from fxtrack.worker.protocol import Result
    from fxtrack.tracking.records import summary_line

    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    _trials(monkeypatch, {"torch": 1.0}, frac=0.5)
    metrics, tags = calibration.mfu_metrics("torch", "cpu", "fp32", "cpu", 1, 0.4, {"torch": None})
    assert "mfu" not in metrics and tags["peak_contended"] == "true"
    result = Result("r", status="FINISHED", metrics={"throughput_samples_per_s": 3.0, **metrics},
                    tags=tags)
    line = summary_line("torch-vit-train-fp32-x1", result)
    assert "no MFU" in line and "other processes used the cores" in line
    assert "no MFU" not in summary_line("x", Result("r", status="FINISHED", metrics={"mfu": 0.1}))


def test_a_quiet_cached_peak_replaces_this_processs_contended_one(tmp_path, monkeypatch):
    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    _trials(monkeypatch, {"torch": 1.2}, frac=0.5)
    _, tags = calibration.mfu_metrics("torch", "cpu", "fp32", "cpu", 1, 0.5, {"torch": None})
    assert tags["peak_contended"] == "true"  # this sweep's first run: a busy machine
    key = peak.cache_key("cpu", "fp32", peak.thread_count(None))
    calibration.store(key, {"torch": ENTRY})  # meanwhile another run calibrated quietly: 1.0
    metrics, tags = calibration.mfu_metrics("torch", "cpu", "fp32", "cpu", 1, 0.5, {"torch": None})
    assert "peak_contended" not in tags and metrics["mfu"] == pytest.approx(0.5)


# ---------------------------------------------------------------- sizing the probe to the device

class FakeDevice:
    """A device computing ``flops_per_s``: ``make(n)`` gives a matmul that advances ``clock``
    by the time it would take; ``sizes`` the sizes made."""

    def __init__(self, flops_per_s: float) -> None:
        self.flops_per_s, self.now, self.sizes = flops_per_s, 0.0, []

    def clock(self) -> float:
        return self.now

    def make(self, n: int):
        self.sizes.append(n)

        def run(reps: int) -> None:
            self.now += 2 * n**3 * reps / self.flops_per_s
        return run


@pytest.mark.parametrize("flops_per_s", [2.5e8, 1e10, 2e11])  # emulated bf16 .. a fast CPU
def test_the_probe_grows_the_matmul_until_one_takes_about_the_target(flops_per_s):
    device = FakeDevice(flops_per_s)
    probe = matmul_probe.probe(device.make, budget_s=None, clock=device.clock)
    assert probe.reps == 1 and probe.trials == matmul_probe.TRIALS
    assert matmul_probe.TARGET_S / 2 <= probe.best_s <= 2 * matmul_probe.TARGET_S
    assert probe.n % matmul_probe.STEP == 0 and probe.tflops == pytest.approx(flops_per_s / 1e12)
    assert device.sizes[0] == matmul_probe.START_N and device.sizes == sorted(device.sizes)
    # growth by at most doubling, so no size's first run is much longer than the target
    assert all(b <= 2 * a for a, b in zip(device.sizes, device.sizes[1:]))
    assert device.now < 8 * matmul_probe.TARGET_S  # warm-ups, growth and best of 3 together


def test_at_its_largest_size_a_fast_device_repeats_the_product():
    device = FakeDevice(5e14)  # a GPU: an 8192^3 product takes 2 ms
    probe = matmul_probe.probe(device.make, budget_s=None, clock=device.clock)
    assert probe.n == matmul_probe.MAX_N and probe.reps > 1
    assert matmul_probe.TARGET_S / 2 <= probe.best_s <= 2 * matmul_probe.TARGET_S
    assert probe.tflops == pytest.approx(500.0)


def test_the_probe_stops_growing_at_its_budget_and_refuses_without_one(monkeypatch):
    device = FakeDevice(2.5e8)  # a 256^3 product: 0.13 s; the target size would take ~2 s
    probe = matmul_probe.probe(device.make, budget_s=0.6, clock=device.clock)
    assert probe.n < 512 and device.now <= 0.6 and probe.tflops == pytest.approx(2.5e-4)
    monkeypatch.setenv(matmul_probe.DEADLINE_ENV, repr(time.time() - 1))  # already passed
    with pytest.raises(matmul_probe.OutOfTime):
        matmul_probe.probe(device.make, clock=device.clock)


# ----------------------------------------------- the budget over every framework's probe

FAKE_INIT = """
from fxtrack.frameworks.declaration import CompileRule, Framework

FRAMEWORK = Framework(
    name="{name}", backend="{name}fw.backend:FakeBackend", extra="{name}", report_order=9,
    compile_rules=(CompileRule(False, "nothing to compile"),), compiled_tag="compiled",
    uncompiled_tag="eager", capabilities={{"calibration": "{name}fw.backend"}})
"""
FAKE_BACKEND = """
import time

from fxtrack.frameworks.base import Backend


class FakeBackend(Backend):
    name = "{name}"

    def version(self): return "0.1"
    def device_kind(self): return "cpu"
    def build(self, batch_size): pass
    def param_count(self): return 1
    def train_step(self): return 0.0
    def loss_value(self, handle): return handle


def matmul_tflops(backend):
    time.sleep({sleep_s})  # a probe that would not end within any budget
    return 2.0


def runner(backend, result):  # a scenario that measures nothing
    result.metrics["ran"] = 1.0
"""


@pytest.fixture
def fake_frameworks(tmp_path, monkeypatch):
    """Frameworks "slow" (its probe sleeps 10 minutes) and "fast" (answers 2 TFLOP/s at once),
    declared through $FXTRACK_CONFIG_DIR and importable by their workers."""
    conf = tmp_path / "conf" / "framework"
    conf.mkdir(parents=True)
    for name, sleep_s in (("slow", 600), ("fast", 0)):
        package = tmp_path / "pkg" / f"{name}fw"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(FAKE_INIT.format(name=name))
        (package / "backend.py").write_text(FAKE_BACKEND.format(name=name, sleep_s=sleep_s))
        (conf / f"{name}.yaml").write_text(textwrap.dedent(f"""
            name: {name}
            package: {name}fw
            """))
    monkeypatch.setenv("FXTRACK_CONFIG_DIR", str(conf.parent))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "pkg"))  # the workers'
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))  # this process's
    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(calibration, "_UNCACHED", {})
    monkeypatch.setattr(calibration, "frameworks", lambda: ["slow", "fast"])  # slow first
    monkeypatch.setattr(calibration, "is_contended", lambda frac: False)  # this is no busy test


def test_the_budget_stops_a_slow_probe_and_keeps_the_others(fake_frameworks, capsys):
    # slow is stopped when only fast's floor is left: seconds for a worker without a framework
    budget_s = 6.0 + calibration.FLOOR_S
    pythons = {"slow": None, "fast": None}
    t0 = time.monotonic()
    entries = calibration.calibrate("cpu", "fp32", "cpu", pythons, budget_s=budget_s)
    elapsed = time.monotonic() - t0
    assert elapsed < 60  # far below the slow probe's 10 minutes: it was stopped
    assert entries["slow"]["tflops"] is None and "budget" in entries["slow"]["stopped"]
    assert entries["fast"]["tflops"] == 2.0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("[fxtrack] calibrating peak FLOP/s: ")]
    assert lines[0].startswith("[fxtrack] calibrating peak FLOP/s: slow fp32 ... stopped at 6.0 s")
    assert "no MFU" in lines[0]
    assert lines[1].startswith("[fxtrack] calibrating peak FLOP/s: fast fp32 ... 2 TFLOP/s (")
    assert len(lines) == 2  # a stopped probe is not tried again within the budget
    # A stopped framework is not cached (a later command tries again), the others are.
    assert set(next(iter(peak.cached().values()))) == {"fast"}
    # This process remembers it; the stopped framework has no rate of its own, and its runs'
    # MFU is against the machine's yardstick, which the other framework's quiet probe set.
    metrics, tags = calibration.mfu_metrics("slow", "cpu", "fp32", "cpu", 1, 0.5, pythons)
    assert "budget" in tags["calibration_stopped"]
    assert "framework_matmul_tflops" not in metrics and "own_matmul_share" not in metrics
    assert metrics["mfu"] == pytest.approx(0.25) and tags["peak_tflops_source"] == "machine-best:fast"
    metrics, tags = calibration.mfu_metrics("fast", "cpu", "fp32", "cpu", 1, 0.5, pythons)
    assert metrics["mfu"] == pytest.approx(0.25) and "calibration_stopped" not in tags
    assert "calibrating" not in capsys.readouterr().err  # served from memory and the cache


def test_a_contended_or_failed_probe_is_tried_again_only_with_budget_left(tmp_path,
                                                                          monkeypatch, capsys):
    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    monkeypatch.setattr(calibration, "_UNCACHED", {})
    monkeypatch.setattr(calibration, "frameworks", lambda: ["torch", "jax"])
    calls = []

    def trial(fw, python, precision, hardware, threads, deadline_s, timeout_s):
        calls.append((fw, deadline_s, timeout_s))
        return (None if fw == "jax" else {"installed": True, "tflops": 1.0}), 0.5  # busy
    monkeypatch.setattr(calibration, "_trial", trial)
    entries = calibration.calibrate("cpu", "bf16", "cpu", {}, budget_s=30.0)
    assert [c[0] for c in calls] == ["torch", "jax"] * calibration.TRIALS  # round by round
    # sized to an equal share of the budget; stopped when only jax's floor would be left
    assert calls[0][1:] == pytest.approx((15.0, 30.0 - calibration.FLOOR_S), abs=0.5)
    assert entries["torch"]["contended"] and "jax" not in entries
    assert "torch bf16 again ... 1 TFLOP/s" in capsys.readouterr().err


def test_a_framework_the_budget_left_no_time_for_is_not_probed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    monkeypatch.setattr(calibration, "_UNCACHED", {})
    monkeypatch.setattr(calibration, "frameworks", lambda: ["torch", "jax"])
    monkeypatch.setattr(calibration, "EXIT_S", 0.1)  # the least a probe is started with
    calls = []

    def trial(fw, python, precision, hardware, threads, deadline_s, timeout_s):
        calls.append(fw)
        time.sleep(1.0)  # the whole budget
        return {"installed": True, "tflops": 1.0}, 0.0
    monkeypatch.setattr(calibration, "_trial", trial)
    pythons = {"torch": None, "jax": None}
    entries = calibration.calibrate("cpu", "fp32", "cpu", pythons, budget_s=1.0)
    assert calls == ["torch"] and entries["torch"]["tflops"] == 1.0
    assert "budget was spent" in entries["jax"]["stopped"]
    assert "jax fp32 ... not probed" in capsys.readouterr().err  # its line too
    calibration.calibrate("cpu", "fp32", "cpu", pythons)
    assert calls == ["torch"]  # this process's next run does not wait for it again


# ------------------------------------------------------------------------ native precision

X86 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 avx512f {}\n\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd {}\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize("cpuinfo, precision, native", [
    (X86.format("avx512_bf16"), "bf16", True),
    (X86.format("amx_bf16 amx_tile"), "bf16", True),
    (X86.format("avx512_vnni"), "bf16", False),  # AVX-512 without its BF16 extension
    (X86.format("avx512_bf16"), "fp16", False),
    (X86.format("avx512_fp16"), "fp16", True),
    (ARM.format("asimdhp bf16"), "bf16", True),
    (ARM.format("asimdhp"), "bf16", False),
    (ARM.format("asimdhp"), "fp16", True),
    (X86.format("avx512_bf16"), "tf32", False),  # no CPU has TF32: it runs as fp32
    (X86.format(""), "fp32", None),  # fp32 is native everywhere: no tag
    ("", "bf16", None),  # no flags to read: unknown, no tag
])
def test_native_precision_on_a_cpu_from_its_cpuinfo_flags(cpuinfo, precision, native):
    assert peak.native_precision(precision, "cpu", cpuinfo=cpuinfo) is native


def test_native_precision_on_a_gpu_from_its_compute_capability(monkeypatch):
    assert peak.native_precision("bf16", "gpu", capability=(8, 0)) is True  # A100
    assert peak.native_precision("bf16", "gpu", capability=(7, 0)) is False  # V100
    assert peak.native_precision("fp16", "gpu", capability=(7, 0)) is True
    assert peak.native_precision("tf32", "gpu", capability=(9, 0)) is True
    monkeypatch.setattr(peak, "gpu_capability", lambda: None)  # no NVML
    assert peak.native_precision("bf16", "gpu") is None


@pytest.mark.parametrize("precision, native, tag", [
    ("bf16", False, "false"), ("fp16", True, "true"), ("fp32", None, None)])
def test_the_worker_tags_whether_the_runs_precision_is_native(fake_frameworks, tmp_path,
                                                              monkeypatch, precision, native, tag):
    from conftest import job_spec

    from fxtrack.worker.__main__ import run

    asked = []
    monkeypatch.setattr(peak, "native_precision", lambda p, kind: asked.append((p, kind)) or native)
    spec = job_spec("torch", "vit", tmp_path, package="fastfw", runner="fastfw.backend:runner",
                    precision=precision)
    spec.framework = "fast"
    result = run(spec)
    assert result.status == "FINISHED", result.error
    assert asked == [(precision, "cpu")] and result.tags.get("native_precision") == tag


def test_a_probe_under_busy_loops_from_the_same_session_is_neither_cached_nor_used(tmp_path):
    """Issue 61: busy loops started from the shell that ran fxtrack share its session, which
    the probe's sampler counted as fxtrack's own work: torch's probe read a third of its quiet
    rate, was cached and the run logged MFU 4.8% against it. A loop per core, started from
    this process's session, as a shell's ``while true`` jobs would be."""
    import os
    import subprocess
    import sys

    from conftest import run_fxtrack
    from test_nothing_lost import TINY, store_runs

    cache = tmp_path / "cache"
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in os.sched_getaffinity(0)]
    try:
        out = run_fxtrack(tmp_path, *TINY, "steps=2", "hardware=cpu",
                          env={"FXTRACK_CACHE": str(cache)})
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    assert out.returncode == 0, out.stderr
    cached = json.loads((cache / "peak_flops.json").read_text()) \
        if (cache / "peak_flops.json").exists() else {}
    assert not [fw for entries in cached.values() for fw, e in entries.items()
                if e.get("tflops")], cached  # no rate cached
    [run] = store_runs(tmp_path)
    assert "mfu" not in run.data.metrics and run.data.tags["fxtrack.peak_contended"] == "true"
    assert "no MFU: the peak FLOP/s was calibrated while other processes used the cores" \
        in out.stderr
    # calibration is a preflight step (issue 59): probed once, before the worker, not after
    assert out.stderr.count("[fxtrack] calibrating peak FLOP/s on ") == 1, out.stderr
    assert out.stderr.index("[fxtrack] calibrating peak FLOP/s") < \
        out.stderr.index("[fxtrack] building "), out.stderr
