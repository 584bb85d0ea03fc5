"""A framework setting added by declaration alone reaches the run name, the report's columns and
compare's pairing, with no shared file edited (issue 29)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

import toy_family
from conftest import job_spec
from fxtrack.config.frameworks import declared, identity_settings
from fxtrack.frameworks.base import Builder
from fxtrack.frameworks.declaration import Setting
from fxtrack.report import compare, samples, select
from fxtrack.tracking.records import run_name

T0 = 1_700_000_000_000


@pytest.fixture
def flavour(monkeypatch):
    """A throwaway identity setting of framework=torch, declared in the test only."""
    monkeypatch.setitem(declared()["torch"].settings, "flavour",
                        Setting("plain", ("plain", "spicy"), "a throwaway", identity=True))


def _frame(values: list[tuple[str, str, float]]) -> pd.DataFrame:
    base = {"status": "FINISHED", "tags.fxtrack.model": "vit", "tags.fxtrack.scenario": "train",
            "tags.fxtrack.precision": "fp32", "tags.fxtrack.devices": "1",
            "tags.fxtrack.hardware": "cpu", "tags.fxtrack.status": "ok",
            "tags.fxtrack.framework": "torch", "params.framework.name": "torch"}
    return pd.DataFrame([dict(base, run_id=run_id, **{"tags.fxtrack.flavour": value,
                                                     "params.framework.flavour": value,
                                                     "metrics.throughput_samples_per_s": x},
                              start_time=pd.Timestamp(T0 + i, unit="ms", tz="UTC"),
                              end_time=pd.Timestamp(T0 + i + 1, unit="ms", tz="UTC"))
                         for i, (run_id, value, x) in enumerate(values)])


def test_a_declared_identity_setting_flows_through_name_report_and_compare(flavour):
    assert "flavour" in identity_settings()
    spicy = job_spec("torch", "vit", framework_settings={"compile_mode": "default",
                                                         "flavour": "spicy"})
    plain = job_spec("torch", "vit", framework_settings={"flavour": "plain"})
    bare = run_name(job_spec("torch", "vit"), "tiny")
    assert run_name(spicy, "tiny") == f"{bare}-spicy"
    assert run_name(plain, "tiny") == bare  # the default: unchanged

    runs = select.latest_runs(_frame([("a", "plain", 1.0), ("b", "spicy", 2.0)])).runs
    assert select.frameworks(runs) == ["torch-plain", "torch-spicy"]  # neither supersedes

    frame = _frame([("a", "plain", 1.0), ("b", "spicy", 2.0)])
    assert "flavour" in samples.identity_columns(frame)
    assert samples.describe({"framework": "torch", "flavour": "spicy", "model": "vit"}, []) == \
        "torch[spicy] vit"
    # compare pairs runs of the same flavour only: a baseline of plain runs has no spicy match
    ident = samples.identity_columns(frame)
    apart = compare.compare(frame.iloc[[0]], frame.iloc[[1]], "throughput_samples_per_s", False,
                            ident)
    assert apart.pairs == []
    same = _frame([("c", "spicy", 4.0)])
    paired = compare.compare(frame.iloc[[1]], same, "throughput_samples_per_s", False, ident)
    assert [p.config["flavour"] for p in paired.pairs] == ["spicy"]


def test_a_non_identity_setting_set_apart_from_its_default_names_the_run():
    spec = job_spec("torch", "vit", framework_settings={"compile_mode": "max-autotune"})
    bare = run_name(job_spec("torch", "vit"), "tiny")
    assert run_name(spec, "tiny") == f"{bare}-compile_mode_max-autotune"


def test_keras_declared_compile_tags_are_the_ones_it_writes():
    keras = declared()["keras"]
    tags = {backend: (keras.compile_mode_tag(True, {"keras_backend": backend}),
                      keras.compile_mode_tag(False, {"keras_backend": backend}))
            for backend in keras.settings["keras_backend"].choices}
    assert tags == {"jax": ("keras-jax:jit", "keras-jax:eager"),
                    "torch": ("keras-torch:torch.compile", "keras-torch:eager"),
                    "tensorflow": ("keras-tensorflow:xla", "keras-tensorflow:tf.function")}


def test_keras_one_device_rule_is_a_declared_limit():
    from fxtrack.scenarios.rules import Combination

    keras = declared()["keras"]
    assert [lim.what for lim in keras.limits if lim.when(Combination("keras", "train", "fp32",
                                                                     devices=2))] == ["devices > 1"]
    assert not any(lim.when(Combination("keras", "train", "fp32")) for lim in keras.limits)


@pytest.fixture
def mlp_family(monkeypatch):
    """tests/toy_family.py's family registered for this test only (its config node too:
    ``fxtrack.config.register`` stores every registered family's models)."""
    from fxtrack.config import register
    from fxtrack.families import spec as registry

    monkeypatch.setitem(registry._REGISTRY, "mlp", toy_family.MLP)
    register()
    return toy_family.MLP


# framework -> (the module it imports, its models module, the toy family's builder there)
TOY_BUILDERS = {"torch": ("torch", "fxtrack.frameworks.torch.models", toy_family.torch_mlp),
                "jax": ("flax", "fxtrack.frameworks.jax.models", toy_family.jax_mlp),
                "tensorflow": ("tensorflow", "fxtrack.frameworks.keras_models",
                               toy_family.keras_mlp)}


@pytest.mark.parametrize("framework", sorted(TOY_BUILDERS))
def test_a_family_declared_by_one_module_is_listed_and_runs_in_process(mlp_family, monkeypatch,
                                                                       tmp_path, framework):
    """Issue 59: a family's one module (tests/toy_family.py) and a builder registered here make
    a model ``--help`` lists, with its defaults, that the in-process backend trains."""
    import importlib

    needs, module, build = TOY_BUILDERS[framework]
    pytest.importorskip(needs)
    from fxtrack import architectures
    from fxtrack.cli import usage
    from fxtrack.worker.__main__ import run

    monkeypatch.setitem(importlib.import_module(module).BUILDERS, "mlp", Builder(build))
    assert "mlp2" in architectures.models()
    listed = next(line for line in usage().splitlines() if line.startswith("  model: "))
    assert "mlp2" in listed.split(": ", 1)[1].split(", ")
    assert architectures.display_name("mlp2") == "MLP (2 layers)"
    spec = job_spec(framework, "mlp2", tmp_path, batch_size=None, steps=None, warmup_steps=None)
    result = run(spec)
    assert (result.status, result.guard) == ("FINISHED", "ok"), result.error
    assert (result.resolved["batch_size"], result.resolved["steps"]) == (4, 3)  # its defaults
    dims = toy_family.MLP_DIMS
    pixels = dims["image_size"] ** 2 * 3
    assert result.metrics["param_count"] == (pixels + 1) * dims["hidden"] + (
        dims["hidden"] + 1) * dims["num_classes"]


def _row(record: dict, run_id: str, i: int) -> dict:
    """One run as the report reads it from MLflow: tags., params., metrics. columns."""
    return {"run_id": run_id, "status": record["status"],
            "start_time": pd.Timestamp(T0 + i, unit="ms", tz="UTC"),
            "end_time": pd.Timestamp(T0 + i + 1, unit="ms", tz="UTC"),
            **{f"tags.{k}": v for k, v in record["tags"].items()},
            **{f"params.{k}": str(v) for k, v in record["params"].items()},
            **{f"metrics.{k}": v for k, v in record["metrics"].items()}}


def test_a_registered_family_flows_through_config_run_name_report_and_compare(
        mlp_family, monkeypatch, tmp_path):
    pytest.importorskip("torch")
    from hydra import compose, initialize_config_dir

    from fxtrack.cli import CONF_DIR
    from fxtrack.config.validate import validate
    from fxtrack.frameworks.torch import models as torch_models
    from fxtrack.orchestrator.job import job_spec as spec_of
    from fxtrack.report import lm
    from fxtrack.tracking.records import dataset_input, job_record
    from fxtrack.worker.__main__ import run

    monkeypatch.setitem(torch_models.BUILDERS, "mlp", Builder(toy_family.torch_mlp))
    overrides = ["framework=torch", "model=mlp2", "hardware=cpu", "framework.compile=false",
                 "model.hidden=32"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        conf, arch = validate(compose(config_name="config", overrides=overrides))
    assert (arch.family, arch.hidden) == ("mlp", 32)

    spec = spec_of(conf, arch, tmp_path)
    spec.progress = False
    result = run(spec)
    assert (result.status, result.guard) == ("FINISHED", "ok"), result.error
    m = result.metrics
    assert m["throughput_samples_per_s"] > 0 and "tokens_per_s" not in m  # not an LM
    assert m["achieved_tflops"] > 0  # from the family's FLOP formula

    name = run_name(spec, "full")
    assert name.startswith("torch-mlp2-train-fp32-x1") and "hidden32" in name
    assert dataset_input(spec, result.resolved)["name"] == "synthetic-mlp2"

    record = job_record(spec, result, {"framework": {"name": "torch"}}, "sqlite:///x.db",
                        "fxtrack", None, T0)
    faster = dict(record, metrics={**m, "throughput_samples_per_s": 2 * m["throughput_samples_per_s"]})
    frame = pd.DataFrame([_row(record, "a", 0), _row(faster, "b", 1)])
    runs = select.latest_runs(frame).runs
    assert list(runs["model"]) == ["mlp2"]  # the later run of the same config supersedes
    assert lm.tables(frame, runs) == []  # no LM table for a plain family
    ident = samples.identity_columns(frame)
    paired = compare.compare(frame.iloc[[0]], frame.iloc[[1]], "throughput_samples_per_s", False,
                             ident)
    assert [p.config["model"] for p in paired.pairs] == ["mlp2"]


# a family attribute read as ``.user_model`` (not the fxtrack.config.user_model module, nor the
# frameworks' capability of that name)
_USER_MODEL_BRANCH = re.compile(r"(?<!config)\.user_model\b")


def test_the_user_model_branch_scan_finds_what_it_must():
    found = [line for line in ('if families.of(arch).user_model:', 'spec.user_model and x',
                               'from fxtrack.config import user_model',
                               '"fxtrack.config.user_model:refusal"')
             if _USER_MODEL_BRANCH.search(line)]
    assert found == ['if families.of(arch).user_model:', 'spec.user_model and x']


def test_no_user_model_branch_outside_frameworks_and_families():
    """Issue 41 item 4: shared code asks the family (fxtrack.families.spec.Family's fields)
    what a user's model needs, not whether the model is one."""
    root = Path(__file__).resolve().parent.parent / "fxtrack"
    offenders = [f"{path.relative_to(root)}:{n}: {line.strip()}"
                 for path in sorted(root.rglob("*.py"))
                 if not {root / "frameworks", root / "families"} & set(path.parents)
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if _USER_MODEL_BRANCH.search(line)]
    assert not offenders, offenders


_FAMILY_COMPARED = re.compile(r"\bfamily\s*(==|!=)|\b(arch|c)\.family\s+(not\s+)?in\b")


def test_no_family_name_compared_in_the_frameworks():
    """Issue 59: a framework asks its models module's Builder record (``BUILDERS[family]``) or
    the family's spec, never compares a family's name."""
    assert [bool(_FAMILY_COMPARED.search(line)) for line in (
        'if self.arch.family == "llama":', 'if arch.family in ("vit", "bert"):',
        'lambda c: c.family == "custom"', 'BUILDERS[self.arch.family].convolutional')] == [
        True, True, True, False]
    root = Path(__file__).resolve().parent.parent / "fxtrack" / "frameworks"
    offenders = [f"{path.relative_to(root)}:{n}: {line.strip()}"
                 for path in sorted(root.rglob("*.py"))
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if _FAMILY_COMPARED.search(line)]
    assert not offenders, offenders


def test_docs_extending_names_the_toy_family_and_every_builders_registry():
    """docs/extending.md's "Adding a model family": the family's module and each framework's
    registry the toy family is registered in."""
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "extending.md").read_text(encoding="utf-8")
    part = text.split("## Adding a model family", 1)[1].split("\n## ", 1)[0]
    assert "`fxtrack/families/<name>.py`" in part and "`tests/toy_family.py`" in part
    for _, module, _ in TOY_BUILDERS.values():
        assert f"`{module.replace('.', '/')}.py`" in part, module
