"""The framework contract: a small Backend, optional capabilities declared by each framework
package (fxtrack.frameworks.declaration) and asked for by name, framework-specific settings, and
shared code that names no framework. A fake framework, declared from a user config directory,
proves that a new framework needs no change outside its own package and YAML."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from conftest import PACKAGES, job_spec
from fxtrack.frameworks import capabilities
from fxtrack.frameworks.capabilities import PROTOCOLS, mismatches, source_functions
from fxtrack.frameworks.declaration import CAPABILITIES, Framework, NotSupported, declaration

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORK_MODULES = ("torch", "tensorflow", "jax", "keras", "flax", "mlflow")

def _tree(module: str) -> ast.Module:
    path = ROOT / (module.replace(".", "/") + ".py")
    return ast.parse(path.read_text(), str(path))


@pytest.mark.parametrize("package", sorted(PACKAGES.values()))
def test_a_framework_package_imports_no_framework(package):
    """Its declaration is read by the orchestrator, which must not start a framework."""
    code = (f"import sys, {package} as p; assert p.FRAMEWORK.name; "
            f"print([m for m in {FRAMEWORK_MODULES!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_base_backend_has_no_stub_and_scenarios_do_not_probe():
    base = _tree("fxtrack.frameworks.base")
    assert "NotImplementedError" not in {n.id for n in ast.walk(base) if isinstance(n, ast.Name)}
    backend = next(n for n in base.body if isinstance(n, ast.ClassDef) and n.name == "Backend")
    methods = {n.name for n in backend.body if isinstance(n, ast.FunctionDef)}
    assert {"capability", "build", "train_step"} <= methods
    assert not methods & {"prepare_inference", "pipeline_loader", "export", "matmul_tflops"}
    for path in sorted((ROOT / "fxtrack" / "scenarios").glob("*.py")):
        calls = [n for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                 and n.func.id == "hasattr"]
        assert not calls, f"{path.name} probes with hasattr at line {calls[0].lineno}"


@pytest.mark.parametrize("framework", sorted(PACKAGES))
def test_every_declared_capability_module_has_its_protocol(framework):
    """Checked from the source, without importing the framework: every declared capability
    names a module of the package defining its protocol's functions with the protocol's
    parameters; absent ones say why."""
    decl = declaration(PACKAGES[framework])
    assert set(decl.capabilities) | set(decl.absent) == set(CAPABILITIES)
    assert not set(decl.capabilities) & set(decl.absent)
    for name, module in decl.capabilities.items():
        assert module.startswith(PACKAGES[framework] + ".")
        path = ROOT / (module.replace(".", "/") + ".py")
        problems = mismatches(PROTOCOLS[name], source_functions(path.read_text()))
        assert not problems, f"{module} as {name}: {'; '.join(problems)}"


def test_no_module_reaches_into_a_backends_private_attributes():
    """Capability modules (and scenarios, helpers) read the backend through what it documents,
    never its private attributes (``backend._step``): the backend's internals stay its own."""
    declared = {m for p in PACKAGES.values() for m in declaration(p).capabilities.values()}
    paths = sorted((ROOT / "fxtrack").rglob("*.py"))
    assert {ROOT / (m.replace(".", "/") + ".py") for m in declared} <= set(paths)
    for path in paths:
        private = [f"backend.{n.attr} (line {n.lineno})" for n in ast.walk(ast.parse(
                       path.read_text())) if isinstance(n, ast.Attribute)
                   and isinstance(n.value, ast.Name) and n.value.id == "backend"
                   and n.attr.startswith("_")]
        assert not private, f"{path.relative_to(ROOT)} reaches into {', '.join(private)}"


def test_each_capability_is_a_protocol_whose_functions_take_the_backend_first():
    assert set(CAPABILITIES) == set(PROTOCOLS)
    for name, protocol in PROTOCOLS.items():
        assert CAPABILITIES[name] and "\n" not in CAPABILITIES[name]  # its one-line meaning
        for function, params in capabilities.functions(protocol).items():
            assert params[0] == ("backend", False), f"{name}: {function}"
    # the two levers used inside Backend.build are markers: nothing called through them
    assert capabilities.functions(PROTOCOLS["remat"]) == {}
    assert capabilities.functions(PROTOCOLS["checkpoint"]) == {
        "save": (("backend", False), ("directory", False)),
        "restore": (("backend", False), ("directory", False))}


CHECKPOINT_MODULE = """
from pathlib import Path

def save(backend, directory: Path, compress=False) -> None:
    pass

def restore(backend, directory):
    pass
"""
RESTORE = "def restore(backend, directory):\n    pass\n"


@pytest.mark.parametrize("restore, problem", [
    ("", "lacks restore(backend, directory)"),
    ("def restore(backend, path):\n    pass\n",
     "defines restore(backend, path), not restore(backend, directory)"),
    ("def restore(directory, backend):\n    pass\n", "defines restore(directory, backend)"),
    ("def restore(backend, directory, strict):\n    pass\n",
     "defines restore(backend, directory, strict)"),
    ("def restore(backend, *, directory):\n    pass\n", "defines restore(backend, *directory)"),
    ("from shutil import copytree as restore\n",
     "binds restore but defines no function restore(backend, directory)"),
])
def test_a_module_short_of_its_protocol_is_caught(restore, problem):
    """The check fails a module that lacks a function or takes other parameters, and passes the
    same module whole (an extra parameter with a default is allowed)."""
    protocol = PROTOCOLS["checkpoint"]
    assert mismatches(protocol, source_functions(CHECKPOINT_MODULE)) == []
    problems = mismatches(protocol, source_functions(CHECKPOINT_MODULE.replace(RESTORE, restore)))
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_asking_for_a_capability_checks_the_imported_module(tmp_path, monkeypatch):
    """Framework.capability checks the module it imports: a broken declaration is a one-line
    TypeError naming what is missing, before a scenario calls into it."""
    (tmp_path / "fxtrack_fake_cap.py").write_text(CHECKPOINT_MODULE)
    (tmp_path / "fxtrack_fake_short.py").write_text(CHECKPOINT_MODULE.replace(RESTORE, ""))
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = Framework(name="fake", backend="x:Y", extra="fake", report_order=9, compile_rules=(),
                     compiled_tag="c", uncompiled_tag="e",
                     capabilities={"checkpoint": "fxtrack_fake_cap",
                                   "serving_export": "fxtrack_fake_short"})
    assert fake.capability("checkpoint").__name__ == "fxtrack_fake_cap"
    with pytest.raises(TypeError, match=r"^fxtrack_fake_short does not provide capability "
                                        r"'serving_export' of fake: lacks export\(backend, "
                                        r"directory\)$"):
        fake.capability("serving_export")


def test_an_absent_capability_is_not_supported_with_the_declared_reason():
    torch = declaration(PACKAGES["torch"])
    with pytest.raises(NotSupported, match="tflite_export is not supported by torch: TFLite "
                                           "export is TensorFlow's"):
        torch.capability("tflite_export")
    with pytest.raises(KeyError):
        torch.capability("teleport")


def test_torch_tflite_through_the_worker_is_a_not_supported_run(tmp_path):
    """A scenario asking for an absent capability: a not-supported run that quotes the
    declared reason, before anything is built."""
    from fxtrack.worker.__main__ import run

    result = run(job_spec("torch", "bert", tmp_path, scenario="inference",
                          runner="fxtrack.scenarios.inference.runner:run", runtime="tflite"))
    assert result.status == "FAILED" and result.tags["unsupported"] == "true"
    assert result.error.startswith("NotSupported: runtime=tflite is not supported by torch ")
    assert declaration(PACKAGES["torch"]).absent["tflite_export"] in result.error
    assert "param_count" not in result.metrics  # refused before the build


# ----------------------------------------------------------------------------- a fake framework
# Added as a user adds a framework: one folder, its package and its config (tests/toy_framework)
TOY_FRAMEWORK = Path(__file__).parent / "toy_framework"


@pytest.fixture
def fake(monkeypatch):
    """fakefw on sys.path, declared through $FXTRACK_CONFIG_DIR/framework/fake.yaml."""
    monkeypatch.syspath_prepend(str(TOY_FRAMEWORK))
    monkeypatch.setenv("FXTRACK_CONFIG_DIR", str(TOY_FRAMEWORK / "conf"))
    return TOY_FRAMEWORK / "conf"


def _compose(user_conf: Path, *overrides: str):
    from fxtrack.cli import CONF_DIR
    from fxtrack.config import register

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[
            *overrides, f"hydra.searchpath=[file://{user_conf}]"])


def test_a_declared_setting_composes_is_checked_and_reaches_the_job_spec(fake, tmp_path):
    from hydra.errors import ConfigCompositionException

    from fxtrack.config.validate import ConfigError, validate
    from fxtrack.orchestrator.job import job_spec as make_spec

    conf, arch = validate(_compose(fake, "framework=fake", "size=tiny"))
    assert make_spec(conf, arch, tmp_path).framework_settings == {"flavour": "plain"}
    conf, arch = validate(_compose(fake, "framework=fake", "framework.flavour=spicy"))
    spec = make_spec(conf, arch, tmp_path)
    assert (spec.package, spec.framework_settings) == ("fakefw", {"flavour": "spicy"})
    with pytest.raises(ConfigError, match="framework.flavour must be one of plain, spicy"):
        validate(_compose(fake, "framework=fake", "framework.flavour=bland"))
    with pytest.raises(ConfigCompositionException):  # a typo of a declared key
        _compose(fake, "framework=fake", "framework.flavor=spicy")
    with pytest.raises(ConfigCompositionException):  # another framework's key
        _compose(fake, "framework=torch", "framework.flavour=spicy")


def test_the_fake_trains_in_the_worker_and_reports_after_the_declared_order(fake, tmp_path):
    from fxtrack.config.frameworks import declared
    from fxtrack.worker.__main__ import run

    spec = job_spec("torch", "vit", tmp_path, package="fakefw",
                    framework_settings={"flavour": "spicy"})
    spec.framework = "fake"
    result = run(spec)
    assert result.status == "FINISHED", result.error
    assert result.tags["flavour"] == "spicy" and result.tags["compile_rule"] == (
        "framework.compile=false")
    spec.scenario, spec.runner = "inference", "fxtrack.scenarios.inference.runner:run"
    result = run(spec)
    assert result.tags["unsupported"] == "true"
    assert result.error == ("NotSupported: inference is not supported by fake: the fake has "
                            "no forward pass")
    assert list(declared()) == ["fake", "torch", "tensorflow", "jax", "keras"]  # report_order 5 first

    import pandas as pd

    from fxtrack.report.select import frameworks

    runs = pd.DataFrame({"framework": ["zzz", "jax", "aaa", "torch", "fake", "tensorflow"]})
    assert frameworks(runs) == ["fake", "torch", "tensorflow", "jax", "aaa", "zzz"]


def test_help_lists_a_declared_setting(fake):
    from fxtrack.cli import usage

    assert ("framework=fake: framework.flavour (plain|spicy, default plain): how the fake tastes"
            in usage())


def test_a_framework_without_calibration_answers_the_matmul_probe_unsupported(fake):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(TOY_FRAMEWORK)]))
    out = subprocess.run([sys.executable, "-m", "fxtrack.worker", "--matmul", "fake", "fakefw",
                          "fp32", "cpu"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer == {"installed": True, "version": "0.1", "device": "cpu", "supported": False,
                      "reason": "calibration is not supported by fake: not implemented for "
                                "this framework"}


def test_the_fake_framework_runs_end_to_end_from_its_folder(fake, tmp_path):
    """The one folder is the whole framework: `python -m fxtrack framework=fake` trains it in a
    worker and logs the run, and `--help` lists it with its setting."""
    import mlflow

    from conftest import run_fxtrack

    env = {"FXTRACK_CONFIG_DIR": str(fake),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(TOY_FRAMEWORK)])}
    proc = run_fxtrack(tmp_path, "framework=fake", "model=vit", "size=tiny", "steps=3",
                       "warmup_steps=1", "framework.flavour=spicy", env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fake-vit-train" in proc.stdout + proc.stderr
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("fxtrack")
    [run] = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags["fxtrack.framework"] == "fake" and run.data.tags["fxtrack.flavour"] == "spicy"
    helped = run_fxtrack(tmp_path, "--help", env=env, timeout=300)
    assert "framework=fake: framework.flavour (plain|spicy, default plain)" in helped.stdout


def test_docs_extending_lists_the_files_of_the_stand_in_framework():
    """docs/extending.md's "Adding a framework" names each file of tests/toy_framework."""
    text = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    part = text.split("## Adding a framework", 1)[1]
    files = {p.relative_to(TOY_FRAMEWORK).as_posix() for p in TOY_FRAMEWORK.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    assert files == {"fakefw/__init__.py", "fakefw/backend.py", "conf/framework/fake.yaml"}
    for name in files:
        assert f"`{name}`" in part, name
