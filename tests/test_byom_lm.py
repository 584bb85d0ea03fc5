"""A user's LM measured as an LM (issue 30 item 6): ``model.kind=lm`` with the inputs'
sequence axis gives ``tokens_per_s`` (sequences/s x that axis' length) and a row in the report's
language-model tables, as model=llama has; a plain model (the default) gets neither; a bad kind
is refused in one line before any work."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import job_spec, report_here, run_fxtrack, seed_peak_cache

from fxtrack.report import lm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
from byom import lm as tiny_lm  # noqa: E402

TINY = ["batch_size=2", "steps=3", "warmup_steps=1", "hardware=cpu"]
SEQ_LEN = 16  # examples/byom/lm.py's default


def env_for(cwd: Path) -> dict[str, str]:
    return {"PYTHONPATH": f"{ROOT / 'examples'}:{ROOT}", **seed_peak_cache(cwd / "cache")}


def test_a_users_lm_logs_tokens_per_s_and_stands_in_the_lm_tables(tmp_path):
    env = env_for(tmp_path)
    proc = run_fxtrack(tmp_path, "framework=torch", "model=custom",
                       "model.torch=byom.lm:build_torch", "model.kind=lm", *TINY, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = tmp_path.glob("outputs/*/*/result.json")
    result = json.loads(path.read_text())
    assert result["status"] == "FINISHED", result["error"]
    m = result["metrics"]
    assert m["param_count"] == tiny_lm.param_count()
    assert m["tokens_per_s"] == pytest.approx(m["throughput_samples_per_s"] * SEQ_LEN)
    assert result["tags"]["model_kind"] == "lm" and result["tags"]["seq_len"] == str(SEQ_LEN)
    proc = report_here(tmp_path, "--no-log", "--format", "md")
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (tmp_path / "fxtrack-report" / "report.md").read_text()
    section = text[text.index("Language models"):]
    cells = next([c.strip() for c in line.split("|")[1:-1]] for line in section.splitlines()
                 if line.startswith("| custom "))
    assert cells[1].split()[0] == "torch" and cells[2] not in ("", "-"), cells  # tokens/s
    assert lm.CUSTOM_NOTE in section


def test_jax_counts_the_tokens_of_a_users_lm_and_a_plain_model_has_none(tmp_path, monkeypatch):
    from fxtrack.worker.__main__ import prepare_environment, run

    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    spec = job_spec("jax", "custom", tmp_path, arch={"jax": "byom.lm:build_jax", "kind": "lm"})
    prepare_environment(spec)
    result = run(spec)
    assert result.status == "FINISHED", result.error
    m = result.metrics
    assert m["tokens_per_s"] == pytest.approx(m["throughput_samples_per_s"] * SEQ_LEN)
    assert m["param_count"] == tiny_lm.param_count()
    plain = run(job_spec("jax", "custom", tmp_path, arch={"jax": "byom.lm:build_jax"}))
    assert plain.status == "FINISHED", plain.error
    assert "tokens_per_s" not in plain.metrics and "model_kind" not in plain.tags


def test_an_lm_whose_inputs_have_no_sequence_axis_is_refused_before_timed_work(tmp_path,
                                                                              monkeypatch):
    from fxtrack.worker.__main__ import run

    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    spec = job_spec("torch", "custom", tmp_path,
                    arch={"torch": "byom.models:build_torch", "kind": "lm", "seq_axis": 2})
    result = run(spec)
    assert result.status == "FAILED" and result.tags.get("unsupported") == "true", result.error
    assert "model.kind=lm needs a sequence axis model.seq_axis=2" in result.error
    assert "(2, 16)" in result.error and "step_time_ms_p50" not in result.metrics


@pytest.mark.parametrize("override,expected", [
    ("model.kind=llm", "model.kind must be one of plain, lm, got 'llm'"),
    ("model.seq_axis=0", "model.seq_axis must be 1 or more (axis 0 is the batch)"),
])
def test_a_bad_kind_or_axis_is_refused_in_one_line(tmp_path, override, expected):
    proc = run_fxtrack(tmp_path, "framework=torch", "model=custom",
                       "model.torch=byom.lm:build_torch", override, *TINY,
                       env=env_for(tmp_path), timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fxtrack:")]
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert "[fxtrack] building" not in proc.stderr


def test_the_lm_tables_take_a_user_lm_and_leave_a_plain_custom_model_out(monkeypatch):
    monkeypatch.setattr(lm.samples, "configs", lambda frame: pd.DataFrame())  # no repeats
    base = {"framework": "torch", "scenario": "train", "precision": "fp32", "devices": 1,
            "hardware": "cpu", "check": "ok", "run_id": "", "contended": None}
    runs = pd.DataFrame([
        {**base, "model": "custom", "model_kind": "lm", "run_id": "a",
         "metrics.tokens_per_s": 1600.0, "metrics.peak_rss_mib": 100.0},
        {**base, "model": "custom", "model_kind": None, "framework": "jax", "run_id": "b",
         "metrics.throughput_samples_per_s": 5.0},
    ])
    (table,) = lm.tables(runs, runs)
    assert [row[:3] for row in table.rows] == [["custom", "torch", "1,600.0"]]
    assert lm.CUSTOM_NOTE in table.notes
