"""scenario=fit: the search on a fake probe, the fit verdicts, the parent's metrics, the refusals,
and (slow) a real tiny search through the worker with its report section and chart."""

from __future__ import annotations

import pytest

from fxtrack.tracking.tracker import Tracker
from fxtrack import architectures
from fxtrack.scenarios.fit import check as fit_config
from fxtrack.config.memory import GIB
from fxtrack.worker.protocol import Result
from fxtrack.scenarios.fit.driver import (FITS, KILLED, OUT_OF_MEMORY, OVER_BUDGET, Probe,
                                      fit_metrics, largest, linear_fit, search, stop_reason,
                                      tolerance, verdict)


def linear_probe(fixed_mib: float, per_sample_mib: float, budget_mib: float, calls: list,
                 fail: str = OVER_BUDGET):
    """A model whose peak grows linearly with batch: fits while the peak is under budget."""
    def probe(batch: int) -> Probe:
        calls.append(batch)
        peak = fixed_mib + per_sample_mib * batch
        return Probe(batch, FITS if peak <= budget_mib else fail, peak, 100.0)
    return probe


@pytest.mark.parametrize("start", [1, 7, 64, 3000])
@pytest.mark.parametrize("resolution", [0.05, 8])
def test_the_search_finds_the_known_largest_batch_within_the_resolution(start, resolution):
    truth = (2048 - 300) // 5  # 349: the largest batch under 2 GiB at 300 MiB + 5 MiB/sample
    calls: list = []
    probes = search(linear_probe(300, 5, 2048, calls), start, 4096, 20, resolution)
    found = largest(probes)
    assert found <= truth and truth - found <= tolerance(found, resolution)
    assert calls == [p.value for p in probes]
    assert stop_reason(probes, 4096, 20, resolution) == "resolution"


def test_the_budget_line_hops_to_the_answer_in_fewer_probes():
    plain = search(linear_probe(300, 0.5, 2048, []), 4, 8192, 20, 0.05)
    hop = search(linear_probe(300, 0.5, 2048, []), 4, 8192, 20, 0.05, budget_mib=2048)
    truth = int((2048 - 300) / 0.5)
    for probes in (plain, hop):
        assert truth - largest(probes) <= tolerance(largest(probes), 0.05)
    assert len(hop) < len(plain) and len(hop) <= 5


def test_the_budget_line_still_finds_the_answer_of_a_model_that_is_not_linear():
    def probe(batch: int) -> Probe:  # peak grows with batch^1.5: the line underestimates
        peak = 300 + 0.02 * batch ** 1.5
        return Probe(batch, FITS if peak <= 2048 else OVER_BUDGET, peak, 1.0)
    truth = int(((2048 - 300) / 0.02) ** (2 / 3))
    probes = search(probe, 4, 8192, 30, 0.05, budget_mib=2048)
    found = largest(probes)
    assert found <= truth and truth - found <= tolerance(found, 0.05)


def test_a_peak_that_plateaus_below_the_line_is_bisected_not_crept_up_on():
    """Torch's RSS on a CPU (measured 2026-12-02, tiny ViT): 589 MiB at batch 4, ~1890 MiB at
    2056 and 2275 alike. The line through such probes meets the budget just above the last fit
    each time; the search must still close the bracket, bisecting after a guess that fitted."""
    def probe(batch: int) -> Probe:
        peak = 589 + 1300 * min(1.0, batch / 2000) + 0.05 * batch
        return Probe(batch, FITS if peak <= 2048 else OVER_BUDGET, peak, 1.0)
    truth = int((2048 - 589 - 1300) / 0.05)  # 3180
    probes = search(probe, 4, 4096, 16, 0.05, budget_mib=2048)
    found = largest(probes)
    assert found <= truth and truth - found <= tolerance(found, 0.05), [p.value for p in probes]
    assert stop_reason(probes, 4096, 16, 0.05) == "resolution"


@pytest.mark.parametrize("fail", [OVER_BUDGET, KILLED, OUT_OF_MEMORY])
def test_a_killed_or_over_budget_probe_does_not_fit(fail):
    probes = search(linear_probe(0, 10, 100, [], fail), 4, 1024, 20, 1)
    assert largest(probes) == 10
    assert all(p.value > 10 for p in probes if p.fit == fail)


def test_the_search_stops_within_max_probes():
    calls: list = []
    probes = search(linear_probe(0, 1, 100_000, calls), 1, 10**6, 5, 0.01)
    assert len(calls) == len(probes) == 5 and largest(probes) == 16
    assert stop_reason(probes, 10**6, 5, 0.01) == "max_probes"


def test_the_search_stops_at_max_batch_and_when_nothing_fits():
    assert largest(search(linear_probe(0, 1, 10**9, []), 100, 256, 8, 0.05)) == 256
    calls: list = []
    assert largest(search(linear_probe(5000, 1, 100, calls), 16, 256, 8, 0.05)) == 0
    assert calls == [16, 8, 4, 2, 1]
    assert stop_reason(search(linear_probe(5000, 1, 100, []), 16, 256, 8, 0.05), 256, 8,
                       0.05) == "nothing_fits"


def test_the_verdicts():
    ok = Result("a", status="FINISHED", metrics={"peak_rss_mib": 900.0})
    assert verdict(ok, 1000.0) == FITS and verdict(ok, 800.0) == OVER_BUDGET
    assert verdict(ok, None) == FITS
    device = Result("b", status="FINISHED", metrics={"peak_rss_mib": 5000.0,
                                                     "peak_mem_device_mib": 700.0})
    assert verdict(device, 1000.0) == FITS  # on a GPU the device's peak is the figure
    killed = Result("c", status="FAILED", error="worker killed by SIGKILL (out of memory? ...)")
    assert verdict(killed, 1000.0) == KILLED
    for error in ("torch.OutOfMemoryError: CUDA out of memory", "RESOURCE_EXHAUSTED: Out of "
                  "memory while trying to allocate", "ResourceExhaustedError: OOM when allocating"):
        assert verdict(Result("d", status="FAILED", error=error), None) == OUT_OF_MEMORY
    assert verdict(Result("e", status="FAILED", error="ValueError: shapes"), 1000.0) is None
    assert verdict(Result("f", status="KILLED", error="interrupted by SIGINT"), 1.0) is None


def test_the_parent_metrics_from_the_probes():
    probes = [Probe(b, FITS, 300 + 5 * b, 50.0 + b) for b in (8, 16, 32)]
    probes.append(Probe(64, OVER_BUDGET, 700.0, 80.0))
    m = fit_metrics(probes, "batch_size", None, 0.5, [81.0, 83.0])
    assert m["max_batch_size"] == 32 and m["fit_probes"] == 4 and m["memory_budget_gib"] == 0.5
    assert m["memory_per_sample_mib"] == pytest.approx(5) and m["fixed_memory_mib"] == \
        pytest.approx(300) and m["memory_fit_r2"] == pytest.approx(1)
    assert m["throughput_at_max_samples_per_s"] == pytest.approx(82.0)
    assert m["throughput_at_max_ci_low"] < 82 < m["throughput_at_max_ci_high"]
    lm = fit_metrics(probes[:3], "seq_len", 128, None, [])
    assert lm["max_seq_len"] == 32 and lm["throughput_at_max_tokens_per_s"] == 82.0 * 32
    assert linear_fit([(1, 2.0)]) is None


def _budget(gib):
    return fit_config.Budget(gib * GIB, "scenario.memory_gib")


def test_bad_fit_input_is_refused_in_one_line():
    vit = architectures.resolve("vit", "tiny")
    why = fit_config.refusal(vit, "seq_len", "fp32", None, "none", _budget(2), 4096)
    assert "scenario.axis=seq_len" in why and "\n" not in why
    llama = architectures.resolve("llama", "full")
    why = fit_config.refusal(llama, "batch_size", "bf16", None, "none", _budget(4), 4096)
    assert "alone need" in why and "\n" not in why  # ~16 B/param of state > 4 GiB
    why = fit_config.refusal(llama, "batch_size", "bf16", None, "none", _budget(24), 4096)
    assert "smallest probe (batch_size=1)" in why and "\n" not in why
    assert fit_config.refusal(llama, "batch_size", "bf16", None, "none", _budget(100), 4096) is None
    start = fit_config.start_value(llama, "batch_size", "bf16", None, "none", "gpu",
                                   _budget(139), 4096)
    assert start >= 1 and fit_config.refusal(llama, "seq_len", "bf16", 1, "none",
                                             _budget(100), 4096) is None


def test_gpu_check_fit_dry_run_lists_both_models_and_starts_nothing(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "bench" / "gpu_check.py"), "--suite", "fit",
                           "--dry-run", "--frameworks", "torch"], capture_output=True, text=True,
                          env=dict(os.environ, OUT=str(tmp_path)), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("fit torch")]
    assert [ln.split()[2] for ln in lines] == ["vit", "llama"] and "start at batch" in lines[1]
    assert not (tmp_path / "fit").exists()


def test_a_builder_that_ignores_batch_size_is_refused_in_one_line(tmp_path, monkeypatch):
    import types

    import numpy as np

    from fxtrack.frameworks import user_builder
    from fxtrack.frameworks.declaration import NotSupported

    (tmp_path / "fixed_batch.py").write_text(
        "import numpy as np\n"
        "def build(batch_size, seed):\n"
        "    x = np.ones((8, 4), np.float32)\n"
        "    return object(), (x, x), lambda out, target: 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    arch = types.SimpleNamespace(dims={"jax": "fixed_batch:build"}, kwargs={})
    framework = types.SimpleNamespace(builder_key="jax", name="jax")
    with pytest.raises(NotSupported, match=r"ignores batch_size: .* is 8, not batch_size=32"):
        user_builder.call(arch, framework, 32, 0)
    model, x, _, _ = user_builder.call(arch, framework, 8, 0)
    assert np.shape(x)[0] == 8


def test_a_fit_of_a_builder_that_ignores_batch_size_is_refused_before_any_probe(tmp_path):
    """The shape-only build of the memory pre-check (a short worker, batch 2) sees the fixed
    leading axis: one line, exit 2, no probe run, nothing logged."""
    import os

    from conftest import run_fxtrack

    pytest.importorskip("torch")
    (tmp_path / "fixed_torch.py").write_text(
        "import torch\n"
        "def build(batch_size, seed):\n"
        "    x = torch.ones(8, 4)\n"
        "    return torch.nn.Linear(4, 4), (x, x), torch.nn.functional.mse_loss\n")
    proc = run_fxtrack(tmp_path, "scenario=fit", "framework=torch", "model=custom",
                       "model.torch=fixed_torch:build", "hardware=cpu", timeout=300,
                       env={"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert "ignores batch_size: its inputs' leading axis is 8, not batch_size=2" in line
    assert not (tmp_path / "mlflow.db").exists()  # nothing ran, nothing logged


@pytest.mark.slow
def test_a_tiny_fit_logs_probes_and_parent_and_the_report_shows_them(tmp_path):
    """Two real probes (torch, tiny ViT, budget 2 GiB of RSS); 0.4 GiB refuses nothing here
    but makes every probe over budget: nothing fits and the parent fails, saying so."""
    mlflow = pytest.importorskip("mlflow")
    from conftest import report_here, run_fxtrack, seed_peak_cache

    env = seed_peak_cache(tmp_path / "cache")
    args = ["scenario=fit", "framework=torch", "model=vit", "size=tiny", "hardware=cpu",
            "framework.compile=false", "steps=1", "warmup_steps=0", "scenario.max_probes=2"]
    proc = run_fxtrack(tmp_path, *args, "scenario.memory_gib=2", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("fxtrack").experiment_id])
    (parent,) = [r for r in runs if "fxtrack.fit_axis" in r.data.tags]
    probes = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(probes) == 2 and all(r.data.tags["fxtrack.fit"] == "fits" for r in probes)
    m = parent.data.metrics
    assert m["fit_probes"] == 2 and m["memory_budget_gib"] == 2
    assert m["max_batch_size"] == max(int(r.data.params["batch_size"]) for r in probes)
    for key in ("throughput_at_max_samples_per_s", "memory_per_sample_mib", "fixed_memory_mib",
                "memory_fit_r2"):
        assert key in m
    assert parent.data.tags["fxtrack.fit_stop"] == "max_probes"
    assert [a.path for a in client.list_artifacts(parent.info.run_id)] == ["fit_memory.png"]
    report = report_here(tmp_path, "--out", str(tmp_path / "rep"))
    assert report.returncode == 0, report.stderr[-2000:]
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "## What fits" in text and "What fits: vit, largest batch_size within 2.00 GiB" in text
    assert list((tmp_path / "rep").glob("fit_vit_batch_size_*.png"))

    proc = run_fxtrack(tmp_path, *args, "scenario.memory_gib=0.4", env=env)
    assert proc.returncode == 1
    failed = [r for r in client.search_runs([client.get_experiment_by_name("fxtrack")
                                             .experiment_id]) if "fxtrack.fit_axis" in r.data.tags
              and r.info.status == "FAILED"]
    assert failed and failed[0].data.metrics["max_batch_size"] == 0
    assert failed[0].data.tags["fxtrack.fit_stop"] == "nothing_fits"


def test_the_sweeps_closing_table_gives_each_fit_jobs_answer():
    from fxtrack.scenarios.fit.section import closing_table

    job = {"name": "torch-vit-fit-fp32-x1-tiny", "tags": {"fxtrack.fit_axis": "batch_size",
                                                          "fxtrack.fit_stop": "resolution"},
           "metrics": {"fit_probes": 5.0, "max_batch_size": 2169.0, "memory_budget_gib": 2.0,
                       "throughput_at_max_samples_per_s": 101.5, "memory_per_sample_mib": 0.67}}
    table = closing_table([job, {"name": "other", "tags": {}, "metrics": {}}], [])
    assert "2,169" in table and "101.5" in table and "resolution" in table
    assert "other" not in table and closing_table([], []) == ""


def test_the_report_section_and_chart_from_a_fake_frame(tmp_path):
    import pandas as pd

    from fxtrack.scenarios.fit import section as fit_report

    now = pd.Timestamp("2026-12-01", tz="UTC")
    rows = []
    for fw, best, per in (("torch", 2169.0, 0.67), ("jax", 1500.0, 0.9)):
        rows.append({"run_id": fw, "status": "FINISHED", "start_time": now,
                     "tags.fxtrack.scenario": "fit", "tags.fxtrack.framework": fw,
                     "tags.fxtrack.model": "vit", "tags.fxtrack.fit_axis": "batch_size",
                     "tags.fxtrack.hardware": "cpu", "tags.fxtrack.precision": "fp32",
                     "metrics.memory_budget_gib": 2.0, "metrics.max_batch_size": best,
                     "metrics.throughput_at_max_samples_per_s": 100.0,
                     "metrics.memory_per_sample_mib": per, "metrics.fixed_memory_mib": 580.0,
                     "metrics.fit_probes": 5.0})
        for b, found in ((8, "fits"), (int(best), "fits"), (int(best * 1.1), "over_budget")):
            rows.append({"run_id": f"{fw}{b}", "status": "FINISHED", "start_time": now,
                         "tags.fxtrack.scenario": "fit", "tags.fxtrack.fit": found,
                         "tags.fxtrack.fit_of": fw, "tags.mlflow.parentRunId": fw,
                         "params.batch_size": str(b), "metrics.peak_rss_mib": 580 + per * b})
    frame = pd.DataFrame(rows)
    section = fit_report.section(frame, frame)
    (table,) = section.tables
    assert section.title == "What fits" and len(table.rows) == 2
    by_fw = {r[0]: r for r in table.rows}
    assert by_fw["torch"][5] == "2,169" and by_fw["jax"][-2] == f"{1500 / 2169:.2f}x"
    assert [f for _, _, f in fit_report.probes_of(frame, "jax", "batch_size")] == [
        "fits", "fits", "over_budget"]
    (chart,) = fit_report.charts(frame, frame, tmp_path, None)
    assert chart.path.exists() and chart.path.stat().st_size > 1000
    assert fit_report.charts(frame.iloc[0:0], frame.iloc[0:0], tmp_path, None) == [] and fit_report.section(
        frame, frame[frame["tags.fxtrack.scenario"] != "fit"]) is None


def test_an_interrupted_fit_closes_its_parent_killed_with_what_it_probed(tmp_path, monkeypatch):
    """A signal during the second probe: the probe's own run is KILLED (the worker's part); the
    fit's parent is logged KILLED too, with the first probe's figures, not left RUNNING."""
    from hydra import compose, initialize_config_dir

    from fxtrack.cli import CONF_DIR
    from fxtrack.config import register
    from fxtrack.config.validate import validate
    from fxtrack.scenarios.fit import driver as fit
    from fxtrack.orchestrator.job import Job

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "scenario=fit", "framework=torch", "model=vit", "size=tiny", "hardware=cpu",
            "scenario.memory_gib=2", f"tracking.uri=sqlite:///{tmp_path / 'm.db'}"])
        conf, arch = validate(cfg)
    job = Job(cfg, conf, arch, str(tmp_path))
    logged: list[dict] = []
    monkeypatch.setattr(Tracker, "log", lambda self, record, artifacts: logged.append(record) or ("id",))
    calls = []

    class Probing:
        def __init__(self, value):
            self.value = value

        def run(self, child_dir, parent, devices, scenario=None, repeat=None, tags=None):
            calls.append(self.value)
            if len(calls) == 2:
                raise SystemExit(130)  # as stop_if_interrupted ends the process
            result = Result("r", status="FINISHED", metrics={"peak_rss_mib": 500.0,
                                                             "throughput_samples_per_s": 9.0})
            tags(result)
            return "n", result, "id"

    monkeypatch.setattr(fit, "_probe_job", lambda job, axis, value: Probing(value))
    with pytest.raises(SystemExit):
        fit.run(job, tmp_path, None)
    assert len(calls) == 2
    last = logged[-1]
    assert last["status"] == "KILLED" and last["tags"]["fxtrack.error"] == "interrupted"
    assert last["metrics"]["max_batch_size"] == calls[0]
