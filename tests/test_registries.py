"""A framework setting added by declaration alone reaches the run name, the report's columns and
compare's pairing, with no shared file edited (issue 29)."""

from __future__ import annotations

import pandas as pd
import pytest

from conftest import job_spec
from fxtrack.config.frameworks import declared, identity_settings
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
