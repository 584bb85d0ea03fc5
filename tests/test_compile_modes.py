"""framework.compile per model family (issue 26): the auto table resolves per device kind and
family, every row says why; framework.compile=tune keeps the faster of the modes it timed and
tags both figures; the config takes tune and refuses an unknown request; a real tiny worker run
with tune on a user's model."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

import pytest
from conftest import job_spec

from fxtrack import architectures, policy
from fxtrack.frameworks.base import Backend
from fxtrack.frameworks.declaration import CompileRule, Framework, Setting, declaration
from fxtrack.worker.protocol import Result
from fxtrack.scenarios import timed

FRAMEWORKS = ("torch", "tensorflow", "jax", "keras")
# every family with a declared model, user models included
FAMILIES = sorted({architectures.family(m) for m in (*architectures.models(), architectures.CUSTOM)})
ROOT = Path(__file__).resolve().parent.parent


def _declared(framework: str) -> Framework:
    return declaration(f"fxtrack.frameworks.{framework}")


# ----------------------------------------------------------------------------- the auto table
@pytest.mark.parametrize("framework,kind,family,compiled", [
    ("tensorflow", "cpu", "vit", True), ("tensorflow", "cpu", "bert", True),
    ("tensorflow", "cpu", "llama", True), ("tensorflow", "cpu", "resnet", False),
    ("tensorflow", "cpu", "custom", False),
    *[("tensorflow", "gpu", f, True) for f in FAMILIES],
    *[("torch", "cpu", f, False) for f in FAMILIES],
    *[("torch", "gpu", f, True) for f in FAMILIES],
    *[("jax", k, f, True) for k in ("cpu", "gpu") for f in FAMILIES],
])
def test_auto_resolves_per_device_kind_and_family(framework, kind, family, compiled):
    got, why = _declared(framework).resolve_compile(kind, family, "auto")
    assert got is compiled and why.startswith("auto: ")


@pytest.mark.parametrize("dims,compiled", [
    ({"hidden": 256, "layers": 4}, True),  # bench/reference.py's Llama: where it was measured
    ({"hidden": 767}, True), ({"hidden": 768}, False),  # [low, high): ViT-B widths tied
    ({"hidden": 64}, False),  # size=tiny: no compile in the short CPU runs
    ({"hidden": 2048}, False),  # the 1B dims at fp32: eager (its row holds at bf16 only)
    (None, False),  # sizes unknown: the row does not hold, the next one does
])
def test_a_sized_row_holds_only_at_its_sizes(dims, compiled):
    got, why = _declared("torch").resolve_compile("cpu", "llama", "auto", dims=dims,
                                                  precision="fp32")
    assert got is compiled
    assert ("hidden 256-767" in why) is compiled
    # the other families keep their rows whatever the sizes
    assert _declared("torch").resolve_compile("cpu", "vit", "auto", dims=dims)[0] is False


@pytest.mark.parametrize("precision,seq_len,compiled", [
    ("bf16", 128, True),  # bench/reference.py's BERT, where it was measured
    ("bf16", 512, True), ("bf16", 16, False),  # size=tiny: too short to repay a compile
    ("fp32", 128, False), (None, 128, False),  # another or an unknown precision: the next row
])
def test_a_row_at_some_precisions_holds_only_there(precision, seq_len, compiled):
    got, why = _declared("torch").resolve_compile("cpu", "bert", "auto",
                                                  dims={"seq_len": seq_len}, precision=precision)
    assert got is compiled and ("at bf16" in why) is compiled
    assert _declared("torch").resolve_compile("gpu", "bert", "auto", precision="fp32")[0]
    vit = {"image_size": 128}  # the reference bench's ViT: compiled at bf16 only
    assert _declared("torch").resolve_compile("cpu", "vit", "auto", dims=vit, precision="bf16")[0]
    assert not _declared("torch").resolve_compile("cpu", "vit", "auto", dims=vit,
                                                  precision="fp32")[0]
    assert not _declared("torch").resolve_compile("cpu", "vit", "auto", dims={"image_size": 32},
                                                  precision="bf16")[0]  # size=tiny


@pytest.mark.parametrize("hidden,precision,compiled", [
    (2048, "bf16", True),  # bench/mfu.py's 1B Llama cell, where it was measured
    (2048, "fp32", False), (2048, None, False),  # another or an unknown precision: eager
    (4096, "bf16", False), (64, "bf16", False),  # the 8B dims, size=tiny: not measured, eager
])
def test_the_1b_llama_compiles_at_bf16_only(hidden, precision, compiled):
    got, why = _declared("torch").resolve_compile("cpu", "llama", "auto", dims={"hidden": hidden},
                                                  precision=precision)
    assert got is compiled and ("(the 1B dims) at bf16" in why) is compiled


def test_a_run_resolves_auto_at_its_own_precision(tmp_path, monkeypatch):
    """timed.build passes the run's precision to the table: bf16 BERT at 128 tokens compiles."""
    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path / "cache"))  # no earlier tune's pick
    from conftest import job_spec

    from fxtrack.worker.protocol import Result
    from fxtrack.scenarios import timed

    class Built(Exception):
        pass

    class Backend:
        framework = _declared("torch")

        def __init__(self, spec):
            self.spec = spec

        def device_kind(self):
            return "cpu"

        def device_tags(self):
            return {}

        def build(self, batch):
            raise Built

    for precision, compiled in (("bf16", True), ("fp32", False)):
        spec = job_spec("torch", "bert", tmp_path, precision=precision, compile_request="auto",
                        arch={"seq_len": 128})
        result = Result(result_id=spec.result_id)
        with pytest.raises(Built):
            timed.build(Backend(spec), result)
        assert result.resolved["compile"] is compiled, precision
        assert result.tags["compile_decision"] == "table"


def test_the_tensorflow_rows_name_their_family_and_mode():
    tf = _declared("tensorflow")
    assert tf.resolve_compile("cpu", "vit")[1].startswith("auto: XLA on CPU for ViT: measured faster")
    assert tf.resolve_compile("cpu", "resnet")[1].startswith("auto: tf.function on CPU for ResNet-50")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_cell_has_a_row_and_every_row_says_why(framework):
    fw = _declared(framework)
    for kind in ("cpu", "gpu"):
        for family in FAMILIES:
            fw.resolve_compile(kind, family, "auto")  # raises where no row matches
    for rule in fw.compile_rules:
        assert isinstance(rule, CompileRule) and rule.why.strip()
        # a measured row (a CPU row of torch's or TensorFlow's) links the measurements page,
        # where the command that chose it lives (tests/test_docs.py checks the anchor)
        if framework in ("torch", "tensorflow") and rule.device_kind == "cpu":
            assert rule.docs.startswith("docs/measurements.md#"), rule


# ----------------------------------------------------------------------------- compile=tune
class SleepBackend(Backend):
    """A fake whose step takes ``SLEEP_S[compiled]``: tune's choice, not a benchmark. Records
    each build's (spec.compile, spec.compile_request)."""

    name = "sleepy"
    SLEEP_S = {True: 0.001, False: 0.03}

    def version(self):
        return "0"

    def device_kind(self):
        return "cpu"

    def build(self, batch_size):
        self.builds = getattr(self, "builds", []) + [(self.spec.compile,
                                                      self.spec.compile_request)]
        self.sleep_s = self.SLEEP_S[self.spec.compile]

    def param_count(self):
        return 1

    def train_step(self):
        time.sleep(self.sleep_s)
        return 1.0

    def loss_value(self, handle):
        return handle


@pytest.fixture
def sleepy(monkeypatch):
    """A declared fake framework (package ``sleepyfw``) with two modes."""
    module = types.ModuleType("sleepyfw")
    module.FRAMEWORK = Framework(
        name="sleepy", backend="unused:Unused", extra="-", report_order=99,
        compile_rules=(CompileRule(False, "never"),), compiled_tag="fast-{compile_mode}",
        uncompiled_tag="slow",
        settings={"compile_mode": Setting("default", ("default",), "its one mode")})
    monkeypatch.setitem(sys.modules, "sleepyfw", module)
    return module


@pytest.mark.parametrize("compiled_faster", [True, False])
def test_tune_keeps_the_faster_mode_and_tags_both_figures(sleepy, monkeypatch, tmp_path,
                                                          compiled_faster):
    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))  # its pick is cached: not in the user's
    sleeps = {True: 0.001, False: 0.03} if compiled_faster else {True: 0.03, False: 0.001}
    monkeypatch.setattr(SleepBackend, "SLEEP_S", sleeps)
    spec = job_spec("torch", "vit", package="sleepyfw", compile_request="tune", steps=3,
                    warmup_steps=1)
    backend, result = SleepBackend(spec), Result(result_id="r")
    timed.build(backend, result)
    assert spec.compile is compiled_faster and result.resolved["compile"] is compiled_faster
    assert result.tags["compile_rule"] == "tuned: fastest of fast-default, slow"
    figures = dict(part.split("=") for part in result.tags["compile_tuned"].split(";"))
    assert list(figures) == ["fast-default", "slow"]
    ms = {mode: float(v.removesuffix("ms")) for mode, v in figures.items()}
    winner, loser = ("fast-default", "slow") if compiled_faster else ("slow", "fast-default")
    assert ms[winner] < ms[loser] and ms[loser] >= 30.0  # the slow mode's sleep, in ms
    # each candidate built as compile=true|false would build it, then the winner afresh
    assert backend.builds == [(True, "true"), (False, "false"),
                              (compiled_faster, "true" if compiled_faster else "false")]
    assert spec.compile_request == "tune"  # as asked, once built


def test_tune_with_one_declared_mode_times_nothing():
    jax = _declared("jax")
    assert jax.resolve_compile("cpu", "vit", "tune") == (
        True, "tuned: jit, the only mode jax declares")
    assert jax.tuned_figures({}) == "jit=not timed (the only mode jax declares)"
    with pytest.raises(ValueError, match="no step time for tf.function"):
        _declared("tensorflow").resolve_compile("cpu", "vit", "tune", {True: 0.1})
    assert _declared("tensorflow").resolve_compile("cpu", "resnet", "tune",
                                                   {True: 0.2, False: 0.1}) == (
        False, "tuned: fastest of xla, tf.function")


# ----------------------------------------------------------------------------- the config
def test_config_takes_tune_and_refuses_an_unknown_request():
    from hydra import compose, initialize_config_dir

    from fxtrack.cli import CONF_DIR
    from fxtrack.config import register
    from fxtrack.config.validate import ConfigError, validate

    assert "tune" in policy.COMPILE_REQUESTS
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        conf, _ = validate(compose(config_name="config", overrides=["framework.compile=tune"]))
        assert conf.framework.compile == "tune"
        with pytest.raises(ConfigError, match="framework.compile must be one of auto, true, "
                                              "false, tune, got 'foo'"):
            validate(compose(config_name="config", overrides=["framework.compile=foo"]))


# ----------------------------------------------------------------------------- a real run
@pytest.mark.slow
def test_tune_runs_a_users_torch_model_in_the_worker(tmp_path, monkeypatch):
    """model=custom (the documented example's MLP) with framework.compile=tune: both torch
    modes timed, the run finishes in the one it kept, tagged."""
    pytest.importorskip("torch")
    from fxtrack.worker.__main__ import run

    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))  # its pick is cached: not in the user's

    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    spec = job_spec("torch", "custom", tmp_path, compile_request="tune", steps=2,
                    warmup_steps=1, arch={"torch": "byom.models:build_torch",
                                          "kwargs": {"width": 32}})
    result = run(spec)
    assert result.status == "FINISHED", result.error
    tags = result.tags
    assert tags["compile_rule"] == "tuned: fastest of inductor:default, eager"
    figures = dict(part.split("=") for part in tags["compile_tuned"].split(";"))
    assert set(figures) == {"inductor:default", "eager"}
    assert all(v.endswith("ms") and float(v[:-2]) > 0 for v in figures.values())
    ms = {mode: float(v[:-2]) for mode, v in figures.items()}
    # what ran is the faster one (the tag's figures are rounded to 0.1 ms: a tie allows either)
    assert ms[tags["compile_mode"]] == min(ms.values())
    assert result.resolved["compile"] is (tags["compile_mode"] != "eager")


def test_the_report_reads_tune_back_as_the_request():
    """The params hold what ran (true/false); the report pairs runs on what was asked."""
    import pandas as pd

    from fxtrack.report.samples import configs

    rules = ["tuned: fastest of xla, tf.function", "auto: XLA on CPU for ViT",
             "framework.compile=false"]
    frame = pd.DataFrame({
        "run_id": ["a", "b", "c"], "start_time": [1, 2, 3], "status": ["FINISHED"] * 3,
        "tags.fxtrack.framework": ["tensorflow"] * 3, "tags.fxtrack.kind": ["run"] * 3,
        "params.framework.compile": ["true", "true", "false"],
        "tags.fxtrack.compile_rule": rules, "metrics.throughput_samples_per_s": [1.0] * 3})
    assert list(configs(frame)["compile"]) == ["tune", "auto", "false"]
