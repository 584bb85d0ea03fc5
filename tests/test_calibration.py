"""Peak FLOP/s calibration (fxtrack.orchestrator.calibration): the frameworks it asks are the ones
the config directories declare, a worker without the capability gives no calibration, and
concurrent runs merging into the one cache file keep each other's entries."""

from __future__ import annotations

import json
import multiprocessing

import pytest

from fxtrack.measure import peak
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

    def trial(fw, python, precision, hardware, threads):
        calls.append(fw)
        if fw == "keras":
            return {"installed": True, "supported": False, "reason": "no matmul probe"}, 0.0
        return {"installed": True, "tflops": 2.0}, 0.0

    monkeypatch.setattr(calibration, "_trial", trial)
    pythons = {"torch": None, "keras": None}
    metrics, tags = calibration.mfu_metrics("keras", "cpu", "fp32", "cpu", 1, 0.5, pythons)
    assert calls.count("keras") == 1  # one answer says it all: no further trials
    assert metrics["mfu"] == pytest.approx(0.25) and tags["peak_tflops_source"] == "measured:torch"
    assert "framework_matmul_tflops" not in metrics
    assert set(json.loads((tmp_path / "peak_flops.json").read_text()).popitem()[1]) == {"torch"}
    calibration.calibrate("cpu", "fp32", "cpu", pythons)
    assert calls.count("keras") == 1  # this process remembers it; the cache does not hold it
    monkeypatch.setattr(calibration, "_UNCACHED", {})  # the next fxtrack command asks again
    calibration.calibrate("cpu", "fp32", "cpu", pythons)
    assert calls.count("keras") == 2 and calls.count("torch") == 3


def _trials(monkeypatch, rates: dict, frac: float):
    """Probes answering ``rates[fw]`` TFLOP/s while other processes take ``frac`` of the cores."""
    monkeypatch.setattr(calibration, "_UNCACHED", {})
    monkeypatch.setattr(calibration, "_trial", lambda fw, *a: (
        {"installed": True, "tflops": rates[fw]} if fw in rates else {"installed": False}, frac))


def test_a_contended_peak_gives_no_mfu_and_the_run_says_why(tmp_path, monkeypatch):
    from fxtrack.job import Result
    from fxtrack.orchestrator.job import summary_line

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


def test_a_quiet_peak_below_a_contended_rate_is_not_the_machines(tmp_path, monkeypatch):
    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    key = peak.cache_key("cpu", "fp32", peak.thread_count(None))
    calibration.store(key, {"jax": ENTRY})  # quiet: 1.0
    _trials(monkeypatch, {"torch": 3.0}, frac=0.5)  # busy, and still 3.0: the peak is higher
    metrics, tags = calibration.mfu_metrics("torch", "cpu", "fp32", "cpu", 1, 0.5, {"torch": None})
    assert tags["peak_tflops_source"] == "measured:torch" and tags["peak_contended"] == "true"
    assert "mfu" not in metrics
    calibration.store(key, {"jax": dict(ENTRY, tflops=4.0)})  # a quiet peak above it: used
    metrics, tags = calibration.mfu_metrics("torch", "cpu", "fp32", "cpu", 1, 0.5, {"torch": None})
    assert tags["peak_tflops_source"] == "measured:jax" and "peak_contended" not in tags
    assert metrics["mfu"] == pytest.approx(0.125) and metrics["framework_matmul_tflops"] == 3.0
