"""Packaging: one version, configs users extend without forking, and a wheel that works from
any directory (``fxtrack --help``, ``doctor``, a tiny run through ``mlflow run`` of a git clone,
``report``), installed into a fresh venv."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml
from conftest import fxtrack_env, run_fxtrack
from hydra import compose, initialize_config_dir
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import fxtrack
from fxtrack.cli import CONF_DIR
from fxtrack.config import register
from fxtrack.config.validate import validate

REPO = Path(__file__).resolve().parents[1]


def test_version_comes_from_one_place(tmp_path):
    proc = run_fxtrack(tmp_path, "--version", timeout=300)
    assert proc.stdout.strip() == f"fxtrack {fxtrack.__version__}", proc.stderr
    assert importlib.metadata.version("fxtrack") == fxtrack.__version__  # pyproject reads it


def test_seeds_table_experiment_is_the_articles_matrix_at_batch_32():
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=seeds_table"],
                      return_hydra_config=True)
        params = {k: str(v) for k, v in cfg.hydra.sweeper.params.items()}
        assert {k: params[k] for k in ("framework", "model", "scenario")} == {
            "framework": "torch,tensorflow,jax", "model": "resnet50,bert,vit",
            "scenario": "train,inference"}
        assert cfg.batch_size == 32
        for framework in params["framework"].split(","):  # every job of the preset is valid
            for model in params["model"].split(","):
                for scenario in params["scenario"].split(","):
                    conf, _ = validate(compose(config_name="config", overrides=[
                        "experiment=seeds_table", f"framework={framework}", f"model={model}",
                        f"scenario={scenario}"]))
                    assert (conf.batch_size, conf.model.name) == (32, model)


USER_CONFIGS = {
    # a site's own hardware option: a GPU node whose jobs get 8 CPU threads
    "hardware/cluster_gpu.yaml": "defaults:\n  - /schema/hardware/base@_here_\n  - _self_\n\n"
                                 "name: gpu\ncpu_threads: 8\n",
    # a named sweep preset of one's own
    "experiment/nightly.yaml": "# @package _global_\nsteps: 7\nhydra:\n  sweeper:\n    params:\n"
                               "      framework: torch,jax\n",
    # a model config naming an architecture fxtrack does not have
    "model/gpt2.yaml": "defaults:\n  - /schema/model/bert@_here_\n  - _self_\n\nname: gpt2\n",
}


@pytest.fixture
def user_dir(tmp_path):
    for name, text in USER_CONFIGS.items():
        (tmp_path / "myconf" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "myconf" / name).write_text(text)
    return tmp_path / "myconf"


@pytest.mark.parametrize("how", ["FXTRACK_CONFIG_DIR", "--config-dir"])
def test_users_add_options_from_their_own_config_dir(tmp_path, user_dir, how):
    env, args = ({"FXTRACK_CONFIG_DIR": str(user_dir)}, []) if how != "--config-dir" else (
        {}, ["--config-dir", str(user_dir)])
    proc = run_fxtrack(tmp_path, *args, "hardware=cluster_gpu", "experiment=nightly", "--cfg",
                       "job", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert (cfg["hardware"]["name"], cfg["hardware"]["cpu_threads"], cfg["steps"]) == ("gpu", 8, 7)


def test_help_lists_the_users_options(tmp_path, user_dir):
    proc = run_fxtrack(tmp_path, "--help", env={"FXTRACK_CONFIG_DIR": str(user_dir)}, timeout=300)
    assert "hardware: auto, cluster_gpu, cpu, gpu" in proc.stdout
    assert "experiment: lm_table, nightly, seeds_table" in proc.stdout


def test_a_user_model_naming_an_unknown_architecture_fails_clearly(tmp_path, user_dir):
    proc = run_fxtrack(tmp_path, "model=gpt2", env={"FXTRACK_CONFIG_DIR": str(user_dir)},
                       timeout=300)
    assert proc.returncode == 2
    listed = proc.stderr.split("unknown model 'gpt2'; choose one of ", 1)[1].split("\n")[0]
    from fxtrack import architectures

    assert set(listed.split(", ")) == {*architectures.models(), "custom"}
    assert not (tmp_path / "mlflow.db").exists()  # failed before any work


def test_user_dirs_join_a_searchpath_given_on_the_command_line(tmp_path):
    from fxtrack.cli import with_user_searchpath

    args = with_user_searchpath(["-m", "hydra.searchpath=[pkg://site.conf]", "model=vit"], [tmp_path])
    assert args == ["-m", f"hydra.searchpath=[pkg://site.conf,file://{tmp_path}]", "model=vit"]
    assert with_user_searchpath(["model=vit"], [tmp_path]) == [
        f"hydra.searchpath=[file://{tmp_path}]", "model=vit"]
    assert with_user_searchpath(["model=vit"], []) == ["model=vit"]


def test_a_missing_user_config_dir_is_named(tmp_path):
    proc = run_fxtrack(tmp_path, "--cfg", "job",
                       env={"FXTRACK_CONFIG_DIR": str(tmp_path / "nope")}, timeout=300)
    assert proc.returncode != 0 and f"{tmp_path / 'nope'}, which is not a directory" in proc.stderr


# ---- the wheel ------------------------------------------------------------------------------

def build_wheel(out: Path) -> Path:
    """The wheel of this tree's files as a clean clone would have them (tracked, plus new files
    git does not ignore), built from a copy so the checkout gets no build/ or egg-info."""
    src = out / "src"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes((REPO / name).read_bytes())
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out / "dist"), str(src)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = (out / "dist").glob("fxtrack-*.whl")
    return wheel


def dependency_closure(requirements: list[str]) -> list[importlib.metadata.Distribution]:
    """The installed distributions that ``requirements`` need, transitively, on this Python."""
    found: dict[str, importlib.metadata.Distribution] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker and not req.marker.evaluate({"extra": extra}):
            continue
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        dist = found.setdefault(key[0], importlib.metadata.distribution(req.name))
        todo += [(Requirement(r), e) for r in dist.requires or [] for e in {"", *req.extras}]
    return list(found.values())


def fresh_venv(root: Path, wheel: Path) -> Path:
    """A new venv (no system site-packages) with the wheel installed non-editable, ``--no-deps``;
    its dependencies are the wheel's own Requires-Dist closure taken from this environment."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    site = Path(subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True,
                   timeout=300)
    with __import__("zipfile").ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines()
                if line.startswith("Requires-Dist:")]
    deps, ours = root / "deps", Path(sysconfig.get_paths()["purelib"])
    deps.mkdir()
    for dist in dependency_closure(requires):
        tops = {Path(f).parts[0] for f in dist.files or []
                if not str(f).startswith(("..", "__pycache__"))}  # not scripts, not bytecode
        for top in tops:
            if (ours / top).exists() and not (deps / top).exists():
                (deps / top).symlink_to(ours / top)
    (site / "zz_fxtrack_test_deps.pth").write_text(f"{deps}\n")  # after the venv's own packages
    return python


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_wheel_works_from_any_directory(tmp_path):
    """``pip wheel`` of this tree, installed non-editable into a fresh venv, run from a directory
    outside the checkout: ``--version``, ``--help``, ``doctor`` (no framework installed there),
    a tiny torch run through ``mlflow run`` of a git clone of the project, then ``report``.

    The cheapest honest install: the fresh venv gets the wheel with ``--no-deps`` and, for its
    dependencies, exactly the closure of the wheel's Requires-Dist, linked from this environment
    (a dependency the code imports but the metadata lacks is missing there, as it would be after
    a real install; no framework is in it). A real resolving install downloads ~800 MB and took
    4.5 minutes on the 2-core CI machine. The framework for the one tiny run is this environment's
    torch, used the documented way, through ``framework.python`` (each framework in its own venv).
    """
    wheel = build_wheel(tmp_path)
    python = fresh_venv(tmp_path, wheel)
    bindir = python.parent
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = fxtrack_env(tmp_path, {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
                                 "PYTHONPATH": "",
                                 "MLFLOW_TRACKING_URI": f"sqlite:///{outside / 'mlflow.db'}"})

    def run(*cmd: str, timeout: int = 600) -> subprocess.CompletedProcess:
        proc = subprocess.run(cmd, cwd=outside, env=env, capture_output=True, text=True,
                              timeout=timeout)
        assert proc.returncode == 0, f"{cmd}: {proc.stderr[-3000:]}"
        return proc

    where = run(str(python), "-c",
                "import fxtrack, fxtrack.cli as c; print(fxtrack.__file__, c.CONF_DIR)").stdout
    assert str(REPO) not in where and "site-packages" in where  # the wheel, not the tree
    version = run(str(bindir / "fxtrack"), "--version").stdout.strip()
    assert version == f"fxtrack {fxtrack.__version__}"
    assert "experiment: lm_table, seeds_table" in run(str(bindir / "fxtrack"), "--help").stdout
    doctor = run(str(bindir / "fxtrack"), "doctor")
    assert "torch" in doctor.stdout and "not installed" in doctor.stdout

    clone = tmp_path / "clone"
    src = tmp_path / "src"  # the files the wheel was built from, committed: a clean clone's view
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "wheel test"]):
        subprocess.run([*git, *cmd], cwd=src, check=True, capture_output=True)
    subprocess.run(["git", "clone", "-q", f"file://{src}", str(clone)], check=True)
    overrides = (f"size=tiny batch_size=2 steps=2 warmup_steps=1 hardware=cpu "
                 f"framework.compile=false framework.python={sys.executable}")
    run(str(python), "-m", "mlflow", "run", f"file://{clone}", "--version", "main",
        "-P", "framework=torch", "-P", "model=vit", "-P", f"overrides={overrides}", "--env-manager", "local",
        "--experiment-name", "fxtrack", timeout=900)
    report = run(str(bindir / "fxtrack"), "report")
    assert "vit" in report.stdout and (outside / "fxtrack-report" / "report.md").exists()


@pytest.mark.full
@pytest.mark.timeout(1800)
def test_the_wheel_installs_its_dependencies_from_the_index(tmp_path):
    """The install a user does: ``pip install fxtrack-*.whl`` into a clean venv, resolving every
    dependency from the package index (~800 MB; 4.5 minutes on the 2-core machine, hence
    ``full``), then ``--version`` and ``doctor`` from outside the checkout."""
    wheel = build_wheel(tmp_path)
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    bindir = tmp_path / "venv" / "bin"
    subprocess.run([str(bindir / "pip"), "install", "-q", str(wheel)], check=True, timeout=1500)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PYTHONPATH"))}
    for args in (["--version"], ["doctor"]):
        proc = subprocess.run([str(bindir / "fxtrack"), *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("not installed") == 3  # doctor: no framework came with the core
