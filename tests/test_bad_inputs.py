"""Issue 60, nothing lost (second step): every bad input is one clear line before any work
(exit 2, nothing run, nothing logged), and the record logs what ran. Most cases are checked
through validation alone (in-process, or the CLI that stops before a worker starts)."""

from __future__ import annotations

import io
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import job_spec, run_fxtrack

from fxtrack.config.validate import ConfigError, validate
from tests.test_config import composed

TINY = ("framework=torch", "model=vit", "size=tiny", "batch_size=2", "steps=2",
        "warmup_steps=1", "hardware=cpu")
# a converge run on a user's file small enough to train in seconds (tests/test_converge.py)
CONVERGE = ("scenario=converge", "framework=torch", "model=vit", "size=tiny", "hardware=cpu",
            "model.layers=1", "model.hidden=16", "model.heads=2", "model.mlp_dim=32",
            "scenario.metric=accuracy", "scenario.target=0.9", "scenario.max_epochs=1",
            "scenario.max_steps=2", "scenario.eval_every=2", "scenario.eval_samples=8",
            "scenario.lr=0.01", "batch_size=4")


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        validate(composed(*overrides))
    assert "\n" not in str(e.value)
    return str(e.value)


def nothing_ran(cwd: Path) -> None:
    assert not (cwd / "mlflow.db").exists()
    spool = cwd / "home" / "spool"
    assert not spool.exists() or not any(spool.iterdir())


def npz(path: Path, x, y) -> Path:
    np.savez(path, x=x, y=y)
    return path


def images(n: int = 48, side: int = 8, classes: int = 3) -> tuple:
    """Learnable square images: each class a bright band in its own rows."""
    rng = np.random.default_rng(0)
    y = np.arange(n) % classes
    x = rng.random((n, side, side)).astype(np.float32) * 0.3
    for i, label in enumerate(y):
        x[i, label * 2:label * 2 + 2, :] += 1.0
    return x, y


# --- 1: a launch directory Hydra cannot write ----------------------------------------------

@pytest.mark.parametrize("args, env, said", [
    # `outputs` a file: Hydra's mkdir fails as on a read-only directory (root ignores modes)
    ([], {}, "outputs is not a directory, and Hydra writes the run's outputs under it"),
    (["-m"], {}, "multirun is not a directory, and Hydra writes the run's outputs under it"),
    # a run.dir only Hydra resolves (no pre-check can see it): Hydra's own OSError, caught
    (["hydra.run.dir=${oc.env:FXTRACK_TEST_OUT}"], {"FXTRACK_TEST_OUT": "outputs/run"},
     "cannot write the run's outputs in {cwd} (Not a directory: 'outputs/run')"),
])
def test_an_unwritable_output_directory_is_one_line_before_any_work(tmp_path, args, env, said):
    """Was Hydra's traceback (``OSError: Read-only file system: 'outputs'``); a sweep had
    logged its parent run first."""
    (tmp_path / "outputs").write_text("")
    (tmp_path / "multirun").write_text("")
    done = run_fxtrack(tmp_path, *args, *TINY, env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert said.format(cwd=tmp_path) in done.stderr
    assert "hydra.run.dir=DIR" in done.stderr or "hydra.sweep.dir=DIR" in done.stderr
    nothing_ran(tmp_path)


def test_a_read_only_launch_directory_is_named(tmp_path, monkeypatch):
    """The pre-check on a directory the process cannot write (as root, only a read-only mount
    is; os.access is what says so there)."""
    from fxtrack.config import validate as checks

    real = os.access
    monkeypatch.setattr(checks.os, "access",
                        lambda p, mode: False if Path(p) == tmp_path else real(p, mode))
    why = checks.output_dir_refusal(["size=tiny"], str(tmp_path))
    assert why.startswith(f"{tmp_path} is not writable, and Hydra writes the run's outputs")
    assert "run from a writable directory (cd), or set hydra.run.dir=DIR and tracking.uri" in why
    assert checks.output_dir_refusal(["-m"], str(tmp_path)).count("hydra.sweep.dir=DIR") == 1
    assert checks.output_dir_refusal(["--cfg", "job"], str(tmp_path)) is None  # prints only
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert checks.output_dir_refusal([f"hydra.run.dir={elsewhere}/${{now:%H}}"],
                                     str(tmp_path)) is None


# --- 2: SIGINT to a worker: its traceback stays in worker.log ----------------------------------

TRACEBACK = (b"Traceback (most recent call last):\n"
             b'  File "/x/converge.py", line 12, in run\n'
             b"    return forward_call(*args, **kwargs)\n"
             b"           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
             b"KeyboardInterrupt\n")


class Chunks:
    """A worker's pipe whose reads end where a test says (``read1``: one chunk a call)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    def read1(self, size: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


@pytest.mark.parametrize("cut", [len(b"Traceback (most recent call last):\n  File \"/x/con"),
                                 TRACEBACK.index(b"return") + 3, TRACEBACK.index(b"Keyboard") + 5])
def test_a_traceback_split_between_reads_stays_in_the_log(monkeypatch, cut):
    """A read ending mid-line made the rest of the line look like the traceback's end, and the
    terminal then showed the rest of the worker's KeyboardInterrupt traceback."""
    from fxtrack.orchestrator import runner

    before, after = b"[fxtrack] converge: accuracy to 0.8\n[fxtrack] step", b" 3 of 10\n"
    text = before + after + TRACEBACK + b"[fxtrack] job stopped: interrupted\n"
    split = len(before + after) + cut
    terminal = types.SimpleNamespace(buffer=io.BytesIO())
    monkeypatch.setattr(sys, "stderr", terminal)
    log = io.BytesIO()
    runner._tee(Chunks([before, after + text[len(before + after):split], text[split:]]), log,
                echo=True)
    assert log.getvalue() == text  # the log keeps everything
    assert terminal.buffer.getvalue() == (
        b"[fxtrack] converge: accuracy to 0.8\n[fxtrack] step 3 of 10\n"
        b"[fxtrack] worker traceback kept in worker.log (verbose=true shows it)\n"
        b"[fxtrack] job stopped: interrupted\n")


def interrupted(backend, result) -> None:
    """A scenario runner stopped by SIGINT mid-run (the worker's own KeyboardInterrupt)."""
    result.metrics["steps_done"] = 3.0
    raise KeyboardInterrupt


def test_sigint_to_a_worker_is_a_stopped_run_with_what_it_measured(tmp_path, capfd):
    """Was an uncaught KeyboardInterrupt: no Result, the run FAILED with 'worker exited with
    status 1: KeyboardInterrupt' and the traceback on the terminal."""
    from fxtrack.worker.__main__ import run

    spec = job_spec("torch", "vit", tmp_path, runner=f"{__name__}:interrupted")
    try:
        result = run(spec)
    except KeyboardInterrupt:  # not pytest's own: the worker let it through
        pytest.fail("the worker's run let KeyboardInterrupt through (no Result, a traceback)")
    assert (result.status, result.error) == (
        "KILLED", "interrupted by SIGINT: the worker was stopped")
    assert result.metrics["steps_done"] == 3.0 and "peak_rss_mib" in result.metrics
    assert "KeyboardInterrupt" in capfd.readouterr().err  # printed for worker.log


# --- 3: a claims file that is not plain YAML data ------------------------------------------

@pytest.mark.parametrize("text, said", [
    ('- !!python/object/apply:os.system ["touch {flag}"]\n', "not plain YAML data ("),
    ("- id: [\n", "not valid YAML ("),
    ("id: x\n", "a claims file is a list of claims, got a dict"),
])
def test_a_claims_file_that_is_not_plain_data_is_one_line(tmp_path, capsys, text, said):
    from fxtrack.report import claims

    flag = tmp_path / "ran"
    path = tmp_path / "claims.yaml"
    path.write_text(text.format(flag=flag))
    assert claims.main(["--claims", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fxtrack claims: {path}: {said}") and err.count("\n") == 1, err
    assert not flag.exists()  # nothing executed
    assert claims.main(["--claims", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml: cannot be read (No such file or directory)" in capsys.readouterr().err


# --- 4, 8: data whose shape or labels would build a model nobody asked for ----------------------

def test_a_wide_file_is_refused_before_any_work(tmp_path):
    """A 50-row, 100,000-column file became image_size=100000 and ran for minutes."""
    wide = npz(tmp_path / "wide.npz", np.zeros((50, 100_000), np.uint8), np.arange(50) % 3)
    why = refusal(*CONVERGE, "data=file", f"data.path={wide}")
    assert why == (f"data.path {wide}: rows of 100,000 features make a 1-D signal of 100,000 "
                   "samples, past the 16,384 the model is built at most (a ViT's time grows "
                   "with the square of its (1 x patch) pieces); 50 rows of 100,000 columns: is "
                   "the table transposed?; keep fewer features")
    big = npz(tmp_path / "big.npz", np.zeros((4, 1100, 1100), np.uint8), np.arange(4) % 2)
    assert "1100 x 1100 images are past the 1024 x 1024" in refusal(
        *CONVERGE, "data=file", f"data.path={big}")


def test_labels_that_make_no_sane_classifier_are_refused(tmp_path):
    """A label of 1,000,000 built 1,000,001 classes (783M parameters at size=full); a file of
    one class 'reached' accuracy 1.000."""
    x, y = images()
    far = y.copy()
    far[0] = 1_000_000
    why = refusal(*CONVERGE, "data=file", f"data.path={npz(tmp_path / 'far.npz', x, far)}",
                  "model.patch=4")
    assert why.startswith("data=file: labels up to 1000000 make 1,000,001 classes (the model's "
                          "output width) from 48 rows; class ids number the classes 0..K-1")
    x = np.zeros((48 * 3, 8, 8), np.float32)
    sparse = np.tile(np.arange(48) % 2, 3) * 100  # ids 0 and 100 of 0..100, 144 rows
    why = refusal(*CONVERGE, "data=file", f"data.path={npz(tmp_path / 's.npz', x, sparse)}",
                  "model.patch=4")
    assert why.startswith("data=file: 2 of the 101 class ids 0..100 are used")
    one = refusal(*CONVERGE, "data=file", "model.patch=4",
                  f"data.path={npz(tmp_path / 'one.npz', *images(classes=1))}")
    assert one.startswith("data=file: every label is 0: one class, which any model predicts at "
                          "accuracy 1.000; a classifier needs two classes or more")


# --- 5, 6, 7: values past what the machine or the frameworks take ------------------------------

def test_threads_seeds_and_buckets_out_of_range_are_refused_in_validation():
    cpus = os.cpu_count()
    assert refusal("hardware.cpu_threads=100000") == (
        f"hardware.cpu_threads=100000 is more than the {cpus} CPUs of this machine; set at "
        f"most {cpus}, or null for the {len(os.sched_getaffinity(0))} cores this process may "
        "run on")
    validate(composed("size=tiny", f"hardware.cpu_threads={cpus}"))  # every CPU is allowed
    for seed in ("99999999999999999999", "-1", "4294967296"):
        assert refusal("size=tiny", f"seed={seed}") == (
            f"seed must be an integer from 0 to 4294967295 (2**32 - 1), got {seed}")
    validate(composed("size=tiny", "seed=4294967295"))
    why = refusal("size=tiny", "scenario=serve", "scenario.batch_buckets=[0,8]")
    assert why == "scenario.batch_buckets are batch sizes, each 1 or more; got [0, 8] (drop 0)"


@pytest.mark.parametrize("override, said", [
    ("seed=99999999999999999999", "seed must be an integer from 0 to 4294967295"),
    ("hardware.cpu_threads=100000", "hardware.cpu_threads=100000 is more than the"),
])
def test_out_of_range_values_stop_the_cli_before_any_work(tmp_path, override, said):
    """Were 'ValueError: Overflow when unpacking long long' and 'worker killed by SIGSEGV':
    a worker started, a FAILED run logged."""
    done = run_fxtrack(tmp_path, *TINY, override, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"fxtrack: invalid config: {said}")
    assert done.stderr.count("\n") == 1, done.stderr
    nothing_ran(tmp_path)


# --- 9: the record says what ran -------------------------------------------------------------

def test_dims_the_data_set_are_the_ones_logged(tmp_path):
    """With data=file (or mnist) the params said model.image_size=32, model.num_classes=1000
    while the model trained on 8 x 8 images of 3 classes."""
    from fxtrack.orchestrator.job import Job
    from fxtrack.tracking import records

    path = npz(tmp_path / "d.npz", *images())
    cfg = composed(*CONVERGE, "data=file", f"data.path={path}", "model.patch=4")
    conf, arch = validate(cfg)
    assert (arch.image_size, arch.num_classes) == (8, 3)
    params = records.config_params(Job(cfg, conf, arch, str(tmp_path)).config)
    assert (params["model.image_size"], params["model.num_classes"]) == (8, 3)
    assert params["model.patch"] == 4 and params["model.hidden"] == 16  # as asked
    # a real run: the store's params are the dims that trained
    done = run_fxtrack(tmp_path, *CONVERGE, "data=file", f"data.path={path}", "model.patch=4",
                       timeout=600)
    assert done.returncode == 0, done.stderr  # a missed target is FINISHED too
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("fxtrack").experiment_id])
    assert run.info.status == "FINISHED", done.stderr
    logged = run.data.params
    assert (logged["model.image_size"], logged["model.num_classes"]) == ("8", "3")
