"""Issue 43: bad input and faults, as a skeptical operator tries them; each ends in one clear
line, with nothing lost. Real subprocesses and real signals where the fault is a process's."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("override, key", [
    ("scenario=serve scenario.rate=nan", "scenario.rate"),
    ("scenario=serve scenario.rate=inf", "scenario.rate"),
    ("scenario=serve scenario.duration_s=nan", "scenario.duration_s"),
    ("scenario=fit scenario.memory_gib=nan", "scenario.memory_gib"),
    ("scenario=fit scenario.memory_gib=inf", "scenario.memory_gib"),
    ("timeout_s=nan", "timeout_s"),
    ("scenario=serve scenario.slo.e2e_ms=inf", "scenario.slo.e2e_ms"),
])
def test_nan_and_inf_are_refused_before_any_work(tmp_path, override, key):
    """Case 3: NaN and inf passed ``value <= 0`` (a NaN timeout_s turned the watchdog off)."""
    proc = subprocess.run([sys.executable, "-m", "fxtrack", "size=tiny", *override.split()],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"fxtrack: invalid config: {key} must be a finite number, got "
                           f"{override.rpartition('=')[2]}\n"), proc.stderr
    assert not (tmp_path / "mlflow.db").exists()  # nothing ran
