"""bench/reference.py's declared rows and arms (issue 61 item 2): every family against its public
peer in every framework (framework=keras on each backend included), each at fp32 and bf16, and
the references' bf16 set up as fxtrack's own (Keras' mixed_bfloat16 policy, torch autocast)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fxtrack import architectures
from fxtrack.config.frameworks import packages
from fxtrack.frameworks.declaration import declaration
from fxtrack.frameworks.keras import KERAS_BACKENDS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ref():
    spec = importlib.util.spec_from_file_location("reference_bench", ROOT / "bench/reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def peers(ref) -> dict[tuple[str, str, str | None], str]:
    """(family, framework, Keras backend) -> its row."""
    return {(architectures.family(model), framework, ref.keras_backend(row)
             if framework == "keras" else None): row
            for row, (model, framework, *_) in ref.ROWS.items()}


def test_every_family_has_a_row_in_every_framework(ref):
    # every family of fxtrack's models has a public peer here in each framework: keras-hub
    # (ViT, BERT, Llama) and keras.applications (ResNet-50) on any Keras backend, Hugging Face
    # and torchvision on torch
    families = {architectures.family(m) for m in architectures.models()}
    wanted = {(f, fw, None) for f in families for fw in packages() if fw != "keras"}
    wanted |= {(f, "keras", b) for f in families for b in KERAS_BACKENDS}
    assert wanted - set(peers(ref)) == set()


def test_every_row_has_fp32_and_bf16_arms(ref):
    assert ref.PRECISIONS == ("fp32", "bf16")
    assert ref.parse([]).precisions == ["fp32", "bf16"]  # a bare run is both
    for row in ref.ROWS:
        for precision in ref.PRECISIONS:
            for modes, kinds in (("best", ["reference", "fxtrack"]),
                                 ("all", ["reference", "fxtrack", "fxtrack", "reference"])):
                arms = [spec for _, spec in ref.arms_of(row, modes, precision)]
                assert [a["kind"] for a in arms] == kinds, (row, modes)
                assert {a["precision"] for a in arms} == {precision}, row


def test_the_control_arm_is_the_reference_again_after_the_others(ref):
    """--control: the base arm's spec once more, last, so every ratio keeps its base and the
    control's ratio is the bench's noise between two processes of one model."""
    assert ref.parse(["--control"]).control and not ref.parse([]).control
    for modes in ("best", "all"):
        plain = ref.arms_of("vit-torch", modes, "bf16")
        arms = ref.arms_of("vit-torch", modes, "bf16", control=True)
        assert arms[:-1] == plain
        (label, control) = arms[-1]
        assert control == plain[0][1] and control is not plain[0][1]
        assert label == f"{plain[0][0]} (control)"


def test_precision_and_row_options(ref):
    assert ref.parse(["--precision", "bf16"]).precisions == ["bf16"]  # the old name still parses
    assert ref.parse(["--only", "*-keras-torch,resnet50-jax"]).rows == [
        "vit-keras-torch", "bert-keras-torch", "llama-keras-torch", "resnet50-keras-torch",
        "resnet50-jax"]
    for bad in (["--precisions", "fp16"], ["--only", "nope-*"]):
        with pytest.raises(SystemExit):
            ref.parse(bad)


def test_resnet50_jax_row_mirrors_the_tensorflow_one(ref):
    model, framework, reference, default, best, needs = ref.ROWS["resnet50-jax"]
    assert (model, framework, reference, needs) == ("resnet50", "jax", "keras-app", "keras")
    assert reference == ref.ROWS["resnet50-tensorflow"][2]  # the same keras.applications model
    assert ref.keras_backend("resnet50-jax") == "jax"
    assert ref.JIT_COMPILE[best] is True and ref.JIT_COMPILE[default] == "auto"


@pytest.mark.parametrize("backend", KERAS_BACKENDS)
def test_keras_rows_run_fxtrack_keras_against_the_same_reference_on_that_backend(ref, backend):
    rows = peers(ref)
    for family in ("vit", "bert", "llama", "resnet"):
        row = rows[family, "keras", backend]
        model, framework, reference, default, best, _ = ref.ROWS[row]
        assert reference == ref.ROWS[rows[family, "tensorflow", None]][2]
        assert ref.keras_backend(row) == backend
        assert ref.JIT_COMPILE[default] == "auto" and ref.JIT_COMPILE[best] is True
        for _, arm in ref.arms_of(row, "all", "bf16"):
            arch, spec = ref.job(dict(arm, dims=ref.QUICK[model], batch=2))
            assert spec.framework == "keras" and spec.precision == "bf16"
            assert spec.framework_settings == {"keras_backend": backend}
            env: dict[str, str] = {}  # what the arm's process sets before Keras' import
            declaration(spec.package).prepare_environment(spec, env)
            assert env["KERAS_BACKEND"] == backend


@pytest.mark.parametrize("precision,policy", [("bf16", "mixed_bfloat16"), ("fp32", "float32")])
def test_keras_reference_is_built_under_the_precisions_policy(ref, precision, policy):
    pytest.importorskip("keras_hub")
    import keras

    arm = dict(kind="reference", reference="keras-hub", model="vit", framework="tensorflow",
               precision=precision, dims=ref.QUICK["vit"], batch=2, mode="auto")
    arch, _ = ref.job(arm)
    previous = keras.config.dtype_policy()
    try:
        model, *_ = ref.keras_reference_model(arm, arch)
    finally:
        keras.config.set_dtype_policy(previous)  # the reference sets it for its whole process
    head = model.layers[-1]
    assert model.dtype_policy.name == head.dtype_policy.name == policy
    assert head.compute_dtype == ("bfloat16" if precision == "bf16" else "float32")
    assert {w.dtype for w in model.trainable_weights} == {"float32"}  # fp32 master weights


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_torch_reference_step_runs_under_autocast_at_bf16(ref, precision, monkeypatch):
    pytest.importorskip("transformers")
    import torch

    seen: set[torch.dtype] = set()
    build = ref.torch_reference_model

    def hooked(arm, arch):  # every Linear's output dtype in the step
        model, forward = build(arm, arch)
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
        return model, forward

    monkeypatch.setattr(ref, "torch_reference_model", hooked)
    arm = dict(kind="reference", reference="hf", model="vit", framework="torch",
               precision=precision, dims=ref.QUICK["vit"], batch=2, mode="eager")
    arch, spec = ref.job(arm)
    step, _ = ref.torch_reference_step(arm, arch, spec)
    step()
    assert seen == {torch.bfloat16 if precision == "bf16" else torch.float32}


def test_an_arm_that_fails_costs_its_row_only(ref, monkeypatch):
    class Dead:  # an arm whose process ended before it was ready
        def __init__(self, label, spec, env):
            raise RuntimeError(f"{label}: the arm's process ended (status 1)")

    monkeypatch.setattr(ref, "Arm", Dead)
    args = ref.parse(["--only", "resnet50-jax", "--quick"])
    row = ref.measure_row("resnet50-jax", "bf16", args)
    assert row["precision"] == "bf16" and "keras-app xla failed" in row["skipped"]
    assert "resnet50-jax" in ref.table([row])[1]
