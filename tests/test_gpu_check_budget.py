"""bench/gpu_check.py --budget (issue 61): one device lease, the never-measured bf16 training
jobs first, what an earlier lease finished skipped, each job sized to the time left; proven
with --dry-run's faked clock and, in-process, a faked clock and worker."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fxtrack.worker.protocol import Result

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"
FIRST = ["torch resnet50 train bf16", "jax resnet50 train bf16", "torch bert train bf16",
         "jax bert train bf16", "torch vit train bf16", "jax vit train bf16",
         "torch llama train bf16", "jax llama train bf16"]
LINE = re.compile(r"^ ?(\d+)\. (\S+ \S+ \S+(?: static| continuous)? \S+)(?: x\d+| \(mnist\))?: "
                  r"(planned (\d+) s .*ends at (\d+) s|skipped: .*|left out: .*)$")


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check_budget", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dry_run(tmp_path: Path, *extra: str) -> tuple[list, str]:
    """`gpu_check.py --budget 780 --dry-run` with $OUT empty: its numbered lines and its output."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--budget", "780", "--dry-run", *extra],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OUT=str(out), PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not out.exists()  # a dry run writes nothing
    return [m.groups() for m in map(LINE.match, proc.stdout.splitlines()) if m], proc.stdout


def test_dry_run_orders_by_value_and_ends_inside_the_budget(gpu_check, tmp_path):
    lines, stdout = dry_run(tmp_path, "--have", str(tmp_path / "none"))
    jobs = [job for _, job, *_ in lines]
    assert jobs[:8] == FIRST  # the bf16 training jobs first, torch and JAX in turn
    assert len(jobs) == 22 and jobs[-2:] == ["torch vit converge bf16", "jax vit converge bf16"]
    assert jobs[8:10] == ["torch resnet50 inference bf16", "jax resnet50 inference bf16"]
    planned = [(int(s), int(end)) for _, _, verdict, s, end in lines if verdict.startswith("plan")]
    left_out = [job for _, job, verdict, *_ in lines if verdict.startswith("left out")]
    assert planned and left_out  # 780 s holds some, not all: the rest is said to be left out
    assert all(v.startswith(("planned", "left out")) for _, _, v, *_ in lines)  # none held
    calibration = int(re.search(r"calibration at bf16 .*planned (\d+) s", stdout).group(1))
    assert calibration == 2 * gpu_check.CALIBRATION_S  # each framework's probe, at its deadline
    ends = [end for _, end in planned]
    assert ends == sorted(ends) and ends[0] == calibration + planned[0][0]
    assert ends[-1] <= 780 - gpu_check.BUDGET_RESERVE_S
    assert calibration + sum(s for s, _ in planned) == pytest.approx(ends[-1], abs=len(ends))
    assert f"planned {len(planned)} jobs, ending at {ends[-1]} s of the 780 s budget" in stdout
    assert "declared estimates" in stdout  # never passed off as measured


def test_dry_run_sizes_a_job_down_to_the_time_left(gpu_check, tmp_path):
    # --steps 1000 cannot all fit: the job the budget ends in is given fewer, the rest left out
    lines, _ = dry_run(tmp_path, "--have", str(tmp_path / "none"), "--calibrate-s", "0",
                       "--steps", "1000")
    steps = [int(m.group(1)) for _, _, v, *_ in lines
             if (m := re.match(r"planned \d+ s \((\d+) timed", v))]
    assert steps[:-1] == [1000] * (len(steps) - 1)
    assert gpu_check.BUDGET_MIN_STEPS <= steps[-1] < 1000
    assert max(int(end) for *_, end in lines if end) <= 780 - gpu_check.BUDGET_RESERVE_S


def test_a_job_is_sized_to_the_time_left_and_never_below_its_minimum(gpu_check, monkeypatch):
    monkeypatch.setitem(gpu_check.BUDGET_ESTIMATE_S, ("vit", "train"), (60.0, 1.0))
    unit = gpu_check.Unit("torch", ("vit", "train", "bf16", 128, {}))
    assert gpu_check.sized(unit, 200.0, 20, 5) == (20, 85.0, 70.0)  # it fits whole
    assert gpu_check.sized(unit, 80.0, 20, 5) == (15, 80.0, 70.0)  # fewer timed steps
    assert gpu_check.sized(unit, 69.0, 20, 5)[1] > 69.0  # below 5 timed steps: not started
    serve = gpu_check.Unit("jax", gpu_check.SERVE_JOB)
    assert gpu_check.sized(serve, 1000.0, 20, 5) == (None, 150.0, 150.0)  # fixed length


def test_dry_run_skips_what_an_earlier_lease_finished(tmp_path):
    have = tmp_path / "lease1"
    have.mkdir()
    Result("r", status="FINISHED", metrics={"mfu": 0.4}).dump(
        have / "torch-resnet50-train-bf16-x1.json")
    Result("r", error="RuntimeError: no GPU").dump(have / "jax-resnet50-train-bf16-x1.json")
    lines, stdout = dry_run(tmp_path, "--have", str(have))
    by_job = {job: verdict for _, job, verdict, *_ in lines}
    assert by_job["torch resnet50 train bf16"] == (
        f"skipped: FINISHED in {have / 'torch-resnet50-train-bf16-x1.json'} (an earlier run)")
    assert by_job["jax resnet50 train bf16"].startswith("planned")  # a failed one runs again
    assert [job for _, job, *_ in lines][:2] == FIRST[:2]  # listed in its place, not run
    assert "1 held from an earlier run" in stdout


def test_budget_stops_starting_jobs_when_spent_and_writes_the_summary_after_each(
        gpu_check, monkeypatch, tmp_path, capsys):
    out = tmp_path / "out"
    monkeypatch.setenv("OUT", str(out))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--budget", "400", "--frameworks",
                                      "torch,jax", "--have", str(tmp_path / "none")])
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name, *a: True)
    clock = gpu_check.FakeClock()
    clock.advance(1000.0)  # any origin: the budget runs from the clock's start
    monkeypatch.setattr(gpu_check, "now", clock)
    end = {"t": clock() + 400.0}

    def matmul_rate(fw, precision):  # each probe takes 20 s of the budget
        clock.advance(20.0)
        return 800.0, "on a fake H200"

    monkeypatch.setattr(gpu_check, "matmul_rate", matmul_rate)
    calls = []

    def run_job(fw, model, scenario, precision, batch, options, steps, warmup, where, timeout_s,
                devices=1):
        summary = out / "summary.json"
        calls.append({"job": f"{fw} {model} {scenario} {precision}", "steps": steps,
                      "timeout_s": timeout_s, "left": end["t"] - clock(),
                      "summary": len(json.loads(summary.read_text())) if summary.exists()
                      else 0})
        clock.advance(100.0)  # every job overruns the estimates: the loop reads the clock
        return Result("r", status="FINISHED", metrics={"achieved_tflops": 400.0}, tags={
            "device": "NVIDIA H200", "matmul_precision": "fp32", "compile_mode": "jit",
            "attention": "sdpa:flash" if fw == "torch" else "cudnn"})

    monkeypatch.setattr(gpu_check, "run_job", run_job)
    assert gpu_check.main() == 0
    stdout = capsys.readouterr().out
    # 40 s of calibration, then 100 s a job: 3 jobs by 340 s; the fourth needs 70 s, 45 are left
    assert [c["job"] for c in calls] == FIRST[:3]
    assert [c["summary"] for c in calls] == [0, 1, 2]  # written after each job, not at the end
    assert all(c["timeout_s"] <= min(240.0, c["left"] - gpu_check.BUDGET_RESERVE_S)
               for c in calls)
    assert clock() - 1000.0 <= 400.0
    assert " 4. jax bert train bf16 x64: left out: the budget ends" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [(e["framework"], e["model"]) for e in summary] == [
        ("torch", "resnet50"), ("jax", "resnet50"), ("torch", "bert")]
    assert summary[0]["metrics"]["mfu_calibrated"] == pytest.approx(0.5)
    assert (out / "jax-resnet50-train-bf16-x1.json").exists()

    # the next lease, in the same $OUT: what finished is skipped, the rest goes on
    calls.clear()
    clock.advance(5000.0)
    end["t"] = clock() + 400.0
    assert gpu_check.main() == 0
    stdout = capsys.readouterr().out
    assert [c["job"] for c in calls] == FIRST[3:6]
    assert "torch resnet50 train bf16 x256: skipped: FINISHED in" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [e["model"] for e in summary] == ["resnet50"] * 2 + ["bert"] * 2 + ["vit"] * 2
    assert [bool(e.get("held")) for e in summary] == [True] * 3 + [False] * 3


def test_budget_refuses_only_and_the_fit_suite(gpu_check, monkeypatch, capsys):
    for extra in (["--only", "resnet50:train"], ["--suite", "fit"]):
        monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--budget", "60", *extra])
        assert gpu_check.main() == 2
    assert "--budget orders the jobs itself" in capsys.readouterr().err
