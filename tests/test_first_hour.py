"""Issue 58, "the first hour, as tried": the run's "next:" lines name commands the user's shell
runs (the README's venv is not on PATH), data=file asks for every missing converge setting in
one message with values that fit the data, the README's `fxtrack compare` example works on the
store the README's commands make, and a converge sweep's closing table shows the time to
target."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fxtrack.config.validate import ConfigError, validate
from conftest import fxtrack_env, run_fxtrack
from tests.test_config import composed
from tests.test_converge import CONVERGE, tiny_images

ROOT = Path(__file__).resolve().parents[1]
BARE_PATH = "/usr/bin:/bin"  # a user's shell without the README's venv on it
NEXT = re.compile(r"^\[fxtrack\] next: (.+) report {4}\(", re.M)


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` as a user's bash runs it, the venv not on PATH."""
    return subprocess.run(["bash", "-c", command], cwd=cwd,
                          env=fxtrack_env(cwd, {"PATH": BARE_PATH}), capture_output=True,
                          text=True, timeout=300)


# --- 1. the "next:" lines -----------------------------------------------------------------------

def test_next_lines_name_the_venvs_script_its_interpreter_or_a_bare_fxtrack(tmp_path, monkeypatch):
    from fxtrack.tracking import ui

    bin_dir = tmp_path / "my venv" / "bin"  # a space: the path must come out shell-quoted
    bin_dir.mkdir(parents=True)
    python, script = bin_dir / "python", bin_dir / "fxtrack"
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setenv("PATH", BARE_PATH)

    def commands() -> list[str]:
        text = ui.next_steps("sqlite:////tmp/x/mlflow.db", "abc123")
        lines = text.splitlines()
        assert lines[1].startswith("[fxtrack] next: ") and "(the answer" in lines[1]
        return [NEXT.search(text).group(1),
                re.search(r"^\[fxtrack\] {7}(.+) ui {8}\(the MLflow UI", text, re.M).group(1)]

    # no script beside the interpreter: the interpreter itself runs the package
    assert commands() == [f"{shlex.quote(str(python))} -m fxtrack"] * 2
    assert shlex.split(commands()[0]) == [str(python), "-m", "fxtrack"]
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    # the script there, not on PATH: by its path, quoted
    assert commands() == [shlex.quote(str(script))] * 2
    assert shlex.split(commands()[0]) == [str(script)]
    # on PATH it is that script: the bare name
    monkeypatch.setenv("PATH", f"{bin_dir}:{BARE_PATH}")
    assert commands() == ["fxtrack", "fxtrack"]
    # another fxtrack first on PATH: not the one that ran, so the path again
    other = tmp_path / "other"
    other.mkdir()
    (other / "fxtrack").write_text("#!/bin/sh\n")
    (other / "fxtrack").chmod(0o755)
    monkeypatch.setenv("PATH", f"{other}:{bin_dir}:{BARE_PATH}")
    assert commands() == [shlex.quote(str(script))] * 2


def test_the_printed_command_runs_from_a_shell_without_the_venv(tmp_path, monkeypatch):
    from fxtrack.tracking import ui

    monkeypatch.setenv("PATH", BARE_PATH)
    command = NEXT.search(ui.next_steps("sqlite:////tmp/x/mlflow.db", None)).group(1)
    assert command != "fxtrack"  # the venv is not on this PATH
    done = shell(f"{command} report --help", tmp_path)
    assert done.returncode == 0 and "usage: fxtrack report" in done.stdout, done.stderr
    if shutil.which("fxtrack", path=BARE_PATH) is None:  # what the old line gave
        assert shell("fxtrack report --help", tmp_path).returncode == 127


# --- 2. data=file: every missing setting in one message ------------------------------------------

FILE_VIT = (*CONVERGE, "data=file", "model.patch=4")


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        validate(composed(*overrides))
    assert "\n" not in str(e.value)
    return str(e.value)


def settings_of(message: str) -> list[str]:
    """The ``scenario.<key>=<value>`` overrides a message tells the user to set."""
    found = re.search(r"values that fit it: set (.+?) \(", message)
    assert found, message
    return found.group(1).split()


def test_data_file_names_every_missing_setting_once_with_values_that_fit_it(tmp_path):
    path = tiny_images(tmp_path / "d.npz", n=200)
    message = refusal(*FILE_VIT, f"data.path={path}", "batch_size=16")
    asked = dict(s.split("=", 1) for s in settings_of(message))
    assert list(asked) == ["scenario.metric", "scenario.target", "scenario.eval_every",
                           "scenario.max_epochs", "scenario.lr"]
    # 200 rows, 0.2 held out: 160 training rows, batch 16: 10 steps an epoch
    assert "160 training images" in message and "10 steps an epoch" in message
    assert asked["scenario.metric"] == "accuracy"  # integer class ids
    assert asked["scenario.eval_every"] == "2" and asked["scenario.max_epochs"] == "50"
    y = np.load(path)["y"]
    commonest = np.bincount(y[np.sort(np.random.default_rng(20261204).permutation(200)[:-40])]).max() / 160
    assert commonest < float(asked["scenario.target"]) < 1.0  # above what guessing scores
    conf, arch = validate(composed(*FILE_VIT, f"data.path={path}", "batch_size=16",
                                   *settings_of(message)))  # pasted back, the run may go
    assert conf.scenario.target == float(asked["scenario.target"])
    # only what is still missing is asked for, valued for the metric set
    message = refusal(*FILE_VIT, f"data.path={path}", "batch_size=16", "scenario.metric=loss",
                      "scenario.lr=0.01", "scenario.max_epochs=3")
    asked = dict(s.split("=", 1) for s in settings_of(message))
    assert list(asked) == ["scenario.target", "scenario.eval_every"]
    entropy = -(np.bincount(y) / len(y) * np.log(np.bincount(y) / len(y))).sum()
    assert 0 < float(asked["scenario.target"]) < entropy  # below a blind guess's loss
    # a file too small for one batch: that first, as no value of the five would mend it
    message = refusal(*FILE_VIT, f"data.path={tiny_images(tmp_path / 's.npz', n=20)}")
    assert "16 training samples, fewer than one batch of 32" in message and "set " in message
    assert "scenario." not in message


def test_a_csv_of_flat_rows_is_asked_the_same_way(tmp_path):
    rng = np.random.default_rng(0)
    table = pd.DataFrame(rng.random((120, 16)), columns=[f"p{i}" for i in range(16)])
    table["label"] = np.arange(120) % 4
    table.to_csv(tmp_path / "t.csv", index=False)
    overrides = (*CONVERGE, "data=file", f"data.path={tmp_path}/t.csv", "model.patch=2")
    message = refusal(*overrides)
    assert "96 training images of shape (4, 4, 1), 4 classes, batch 32: 3 steps an epoch" in message
    assert len(settings_of(message)) == 5
    validate(composed(*overrides, *settings_of(message)))


# --- 3 and 4: the first hour, run ---------------------------------------------------------------

@pytest.fixture(scope="module")
def readme_store(tmp_path_factory):
    """The README's tiny sweep, on the two frameworks its compare example names."""
    cwd = tmp_path_factory.mktemp("readme")
    frames = {"FXTRACK_FRAMES_OUT": str(cwd / "frames.txt"),  # tests/frames counts the run path
              "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests" / "frames"),
                                                          os.environ.get("PYTHONPATH")]))}
    done = run_fxtrack(cwd, "-m", "framework=torch,jax", "model=vit", "size=tiny", "batch_size=2",
                       "steps=3", "warmup_steps=1", "hardware=cpu", env=frames, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return cwd, done.stderr


def test_the_run_path_is_at_most_ten_fxtrack_frames_from_the_command_to_the_step(readme_store):
    """Issue 59: the orchestrator's frames from ``python -m fxtrack`` down to the worker's start
    and the worker's from its ``__main__`` down to the framework's step, together, at most 10
    (counted by tests/frames/sitecustomize.py in the README sweep's own processes)."""
    cwd, _ = readme_store
    lines = (cwd / "frames.txt").read_text().splitlines()
    depth = {}
    for line in lines:
        where, count, *frames = line.split()
        depth.setdefault(where, []).append((int(count), frames))
    (orchestrator,) = depth["orchestrator"]  # one process ran the sweep
    workers = depth["worker"]
    assert len(workers) == 2, lines  # torch's and JAX's
    assert orchestrator[1][:2] == ["__main__.py:<module>", "cli.py:main"], lines
    for count, frames in workers:
        assert frames[0] == "worker/__main__.py:<module>", lines
        assert frames[-1].startswith("frameworks/") and frames[-1].endswith(":train_step"), lines
        assert orchestrator[0] + count <= 10, lines


def readme_compare() -> str:
    lines = [line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
             if " compare --baseline" in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith(".venv/bin/fxtrack compare ")
    return lines[0]


def test_the_readme_compare_example_parses():
    from fxtrack.report import compare, samples

    argv = shell(f"printf '%s\\n' {readme_compare().split(' ', 1)[1]}", ROOT).stdout.splitlines()
    args = compare.parse_args(argv[1:])  # as bash splits it, after "compare"
    selected = samples.selected_keys(args.baseline) | samples.selected_keys(args.candidate)
    assert selected == {"tags.fxtrack.framework"}  # the frameworks differ; the rest pairs


def test_the_readme_compare_example_works_on_the_readmes_store(readme_store):
    """Run as the user would: the sweep's own "next:" command, from a shell without the venv,
    the README's arguments."""
    cwd, stderr = readme_store
    command = NEXT.search(stderr).group(1)
    line = readme_compare().split("   # ", 1)[0]  # --out before the comment: the pairs
    done = shell(line.replace(".venv/bin/fxtrack", command, 1) + " --out cmp", cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no runs" not in done.stderr and "Candidate vs baseline" in done.stdout
    pairs = pd.read_csv(cwd / "cmp" / "compare.csv")
    pairs = pairs[pairs["ratio"].notna()]  # not the configs found on one side only
    assert len(pairs) == 1 and pairs["model"].tolist() == ["vit"], done.stdout
    assert "framework" not in pairs and pairs["ratio"].iloc[0] > 0  # jax / torch, paired


@pytest.fixture(scope="module")
def converge_first_hour(tmp_path_factory):
    """data=file as a new user meets it: a run without the settings (refused, exit 2), then a
    repeats=2 torch sweep with the values the refusal gave."""
    cwd = tmp_path_factory.mktemp("first-hour")
    path = tiny_images(cwd / "d.npz", n=200)
    base = (*FILE_VIT, "framework=torch", f"data.path={path}", "batch_size=16", "hardware=cpu")
    refused = run_fxtrack(cwd, *base, timeout=300)
    done = run_fxtrack(cwd, "-m", *base, "repeats=2", *settings_of(refused.stderr), timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return cwd, refused, done


def test_data_file_is_refused_once_before_any_worker(converge_first_hour):
    _, refused, _ = converge_first_hour
    assert refused.returncode == 2
    assert "fxtrack: invalid config: scenario=converge on data=file needs 5 setting(s)" in refused.stderr
    assert "[fxtrack] converge:" not in refused.stderr and "mlflow.db" not in refused.stderr


def test_the_converge_sweeps_closing_table_shows_the_time_to_target(converge_first_hour):
    import mlflow

    cwd, _, done = converge_first_hour
    table = done.stderr.split("Time to target (scenario=converge", 1)[1].split("\n\n", 1)[0]
    assert "Aggregates (" not in done.stderr  # converge's row there was all "-"
    client = mlflow.MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("fxtrack").experiment_id])
    repeats = [r for r in runs if r.data.tags.get("fxtrack.repeat_of")]
    assert len(repeats) == 2 and all(r.data.metrics["reached_target"] == 1.0 for r in repeats)
    median = float(np.median([r.data.metrics["time_to_target_s"] for r in repeats]))
    ((cells, text),) = [row for name, row in table_rows(table).items()
                        if name.startswith("torch-vit-converge")]  # the aggregate, not its repeats
    assert cells[:2] == ["2/2", f"{median:,.1f}"] and "run(s): needs" in text, table


def test_the_converge_table_takes_the_reports_rule():
    from fxtrack.scenarios.converge.section import closing_table as converge_table

    def job(name, reached, seconds=None, aggregate=None, contended=False):
        metrics = {"reached_target": float(reached), "final_eval_accuracy": 0.8}
        if reached:
            metrics.update(time_to_target_s=seconds, steps_to_target=40.0)
        return {"name": name, "metrics": metrics, "aggregate": aggregate,
                "tags": {"fxtrack.contended": "true" if contended else "false"}}

    five = [job(f"five-r{i}", t is not None, t, "agg5") for i, t in enumerate([3, 1, 2, None, 5])]
    three = [job(f"three-r{i}", True, t, "agg3") for i, t in enumerate([4, 6, 9])]
    missed = [job(f"miss-r{i}", i == 0, 2.0, "aggm") for i in range(2)]
    aggregates = [{"id": a, "name": a.replace("agg", "config"), "metrics": {"reached_target": 1.0},
                   "tags": {"fxtrack.contended_repeats": "1"} if a == "agg3" else {}}
                  for a in ("agg5", "agg3", "aggm")]
    singles = [job("alone", True, 2.61, contended=True), job("short", False)]
    table = converge_table([*five, *three, *missed, *singles], aggregates)
    rows = table_rows(table)
    # MLPerf: the fastest (1) and the slowest (the missed run) dropped, the mean of 2, 3, 5
    assert rows["config5"][0][:2] == ["4/5", "3.3"] and "middle 3 of 5" in rows["config5"][1]
    # fewer than five: the median with the rule's reason, as the page shows the same figure
    assert rows["config3"][0][:2] == ["3/3", "6.0"] and "3 run(s): needs repeats=5" in rows["config3"][1]
    assert "contended in 1" in rows["config3"][1]
    assert rows["configm"][0][:2] == ["1/2", "2.0"] and "needs repeats=5" in rows["configm"][1]
    assert rows["alone"][0][:4] == ["1/1", "2.6", "40", "accuracy 0.800"]
    assert "contended" in rows["alone"][1]
    assert rows["short"][0][:2] == ["0/1", "-"]
    assert not any(name.startswith(("five", "three", "miss")) for name in rows)  # in aggregates
    assert converge_table([{"name": "t", "metrics": {"throughput_samples_per_s": 1.0}}], []) == ""


def table_rows(table: str) -> dict[str, tuple[list[str], str]]:
    """A closing table's rows by the start of their first cell: (the cells of the row's first
    line, the row's lines as one text, whitespace collapsed: a wrapped cell reads whole)."""
    lines = table.split("\n-", 1)[1].splitlines()[1:]  # below the header's rule
    rows: dict[str, tuple[list[str], str]] = {}
    name = None
    for line in filter(str.strip, lines):
        if not line.startswith(" "):
            cells = re.split(r"\s{2,}", line.strip())
            name = cells[0]
            rows[name] = (cells[1:], "")
        rows[name] = (rows[name][0], " ".join((rows[name][1] + " " + line).split()))
    return rows
