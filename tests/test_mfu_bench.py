"""bench/mfu.py (issue 46, item 1): the table's MFU is the run's logged ``mfu`` for the same
config, a cell that cannot run says why, and bad flags fail in one line before any work."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import fxtrack_env

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mfu_bench", ROOT / "bench" / "mfu.py")
mfu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mfu)

VIT = {"framework": "torch", "model": "vit", "precision": "fp32"}
PEAK_TFLOPS = 0.2


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """One tiny run of the table: torch's ViT (2 repeats) and a Llama refused before any work."""
    from fxtrack.measure import peak

    tmp = tmp_path_factory.mktemp("mfu")
    # The yardstick: a quiet calibration entry in this test's own cache, as a quiet first run
    # leaves one (a contended calibration on this shared machine would log no mfu at all);
    # its value is immaterial here, only that the table divides by what the run divided by.
    # Three steps: a median step time unlike the mean, so that an MFU taken from the p50
    # instead of the window's throughput would not pass.
    key = peak.cache_key("cpu", "fp32", peak.thread_count(None))
    (tmp / "cache").mkdir()
    (tmp / "cache" / "peak_flops.json").write_text(json.dumps({key: {"torch": {
        "tflops": PEAK_TFLOPS, "date": "2026-12-04T00:00:00Z", "contended": False}}}))
    env = fxtrack_env(tmp, dict(
        PYTHONPATH=str(ROOT), FXTRACK_CACHE=str(tmp / "cache"),
        FXTRACK_MEMORY_GIB="0.001"))  # the pre-check refuses the Llama (a tiny ViT has no
    # estimate off its canonical size: it runs)
    store = f"sqlite:///{tmp / 'mlflow.db'}"
    out = subprocess.run([sys.executable, "bench/mfu.py", "--size", "tiny", "--frameworks",
                          "torch", "--families", "vit,llama", "--precisions", "fp32",
                          "--repeats", "2", "--set", "steps=3", "--set", "warmup_steps=1",
                          "--store", store, "--out", str(tmp / "mfu.md")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out, store, (tmp / "mfu.md").read_text()


def test_table_mfu_equals_the_runs_logged_mfu(bench):
    from fxtrack import stats
    from fxtrack.tracking import reader

    out, store, markdown = bench
    [experiment] = [e for e in reader.experiment_names(store) if e.startswith("mfu-")]
    frame = reader.load_runs(store, experiment)
    runs = mfu.runs_of(frame, VIT)
    repeats = runs[runs["tags.fxtrack.kind"] != "aggregate"]
    if "tags.fxtrack.peak_contended" in repeats and (repeats["tags.fxtrack.peak_contended"]
                                                     == "true").any():
        pytest.skip("the run says peak_contended: it logged no mfu to compare with")
    figures = mfu.figures(runs)
    assert figures["repeats"] == 2 and len(figures["mfu"]) == 2
    for computed, logged in zip(figures["mfu"], figures["logged_mfu"]):
        assert logged is not None and logged > 0
        assert computed == pytest.approx(logged, rel=1e-6)
    # the cell's headline is the median, which the aggregate run logged as its mfu
    [aggregate] = runs[runs["tags.fxtrack.kind"] == "aggregate"]["metrics.mfu"]
    assert stats.median(figures["mfu"]) == pytest.approx(aggregate, rel=1e-6)
    assert figures["peak"] == pytest.approx(PEAK_TFLOPS) and figures["source"] == "machine-best:torch"
    # ... and it is what the table shows, printed and in the markdown (with the machine, the
    # date and the command)
    shown = f"{100 * stats.median(figures['mfu']):.1f} ["
    row = next(line for line in markdown.splitlines() if line.startswith("| ViT-B/16"))
    assert shown in row and "machine-best:torch" in row and "2/2" in row
    assert shown in out.stdout
    assert "- machine: " in markdown and "- date: " in markdown
    assert "- command: python bench/mfu.py --size tiny" in markdown


def test_a_cell_that_cannot_run_shows_why(bench):
    out, _, markdown = bench
    row = next(line for line in markdown.splitlines() if line.startswith("| Llama"))
    assert "will not fit in memory, nothing was run" in row
    assert "will not fit" in out.stdout  # the terminal table may wrap the rest
    # progress: one line per cell as it starts and as it ends, with its time
    assert "1/2 torch vit fp32: started" in out.stderr
    assert "1/2 torch vit fp32: ended after" in out.stderr
    assert "2/2 torch llama fp32: will not fit in memory" in out.stderr


def test_a_failed_run_shows_its_error():
    runs = pd.DataFrame([{"status": "FAILED", "tags.fxtrack.framework": "torch",
                          "tags.fxtrack.error": "RuntimeError: out of memory"}])
    assert mfu.figures(runs)["reason"] == "1 of 1 repeats failed: RuntimeError: out of memory"


@pytest.mark.parametrize("flags,says", [
    (["--frameworks", "torch,mxnet"], "unknown framework 'mxnet'"),
    (["--families", "gpt2"], "unknown family 'gpt2'"),
    (["--precisions", "fp16"], "unknown precision 'fp16'"),
    (["--repeats", "0"], "--repeats: must be a whole number >= 1"),
    (["--size", "huge"], "invalid choice: 'huge'"),
    (["--set", "steps"], "must be KEY=VALUE"),
    (["--out", "/no/such/dir/mfu.md"], "--out: no directory"),
])
def test_bad_flags_fail_in_one_line_before_any_work(flags, says, tmp_path):
    store = tmp_path / "mlflow.db"
    out = subprocess.run([sys.executable, "bench/mfu.py", "--store", f"sqlite:///{store}", *flags],
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and says in out.stderr
    assert out.stdout == "" and not store.exists()


def test_the_llama_cells_fit_24_gib():
    from fxtrack import architectures
    from fxtrack.config import memory

    arch = architectures.resolve("llama", seq_len=mfu.LLAMA["model.seq_len"])
    for precision in mfu.PRECISIONS:
        need = memory.estimate(arch, "train", precision, mfu.LLAMA["batch_size"]).total
        assert need <= mfu.LLAMA_MARGIN * mfu.LLAMA_BUDGET_GIB * memory.GIB, precision


def test_profile_columns_show_where_the_runs_logged_them():
    run = {"status": "FINISHED", "tags.fxtrack.devices": "1",
           "tags.fxtrack.peak_tflops_source": "machine-best:torch", "metrics.mfu": 0.5,
           "metrics.flops_per_sample": 1e12, "metrics.throughput_samples_per_s": 0.1,
           "metrics.peak_tflops": 0.2, "metrics.step_time_ms_p50": 10_000.0,
           **{f"metrics.profile_{part}_ms": 100.0 * (i + 1) for i, part in enumerate(mfu.PROFILE)}}
    figures = mfu.figures(pd.DataFrame([run]))
    assert figures["mfu"] == [pytest.approx(0.5)]
    args = mfu.parse_args(["--size", "tiny"])
    table = mfu.table([(VIT, figures)], args)
    assert "matmul ms" in table.header and "norm/elementwise ms" in table.header
    row = dict(zip(table.header, table.rows[0]))
    assert row["optimizer ms"] == "400.0" and row["step ms"] == "600.0"
    assert row["MFU % [95%]"] == "50.0 [50.0, 50.0] *"  # below 60%: marked
    # runs without them: no such columns
    plain = {k: v for k, v in run.items() if "profile_" not in k}
    assert "matmul ms" not in mfu.table([(VIT, mfu.figures(pd.DataFrame([plain])))], args).header
    # a --set override wins over the cell's own (framework.compile=auto): the table says so
    assert not any("--set" in note for note in table.notes)
    forced = mfu.parse_args(["--size", "tiny", "--set", "framework.compile=true"])
    assert "--set framework.compile=true" in mfu.table([(VIT, figures)], forced).notes
