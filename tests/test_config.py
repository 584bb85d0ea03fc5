"""The Hydra configuration: composition with compose(), the size table, and bad input failing
fast with a clear message (through the real CLI, which stops before any work)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from conftest import run_fxtrack
from omegaconf import OmegaConf

from fxtrack import architectures
from fxtrack.cli import CONF_DIR
from fxtrack.config import register
from fxtrack.config.validate import ConfigError, validate
from fxtrack.worker.protocol import JobSpec


def composed(*overrides: str):
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_defaults_compose_to_the_canonical_vit_in_torch():
    cfg = OmegaConf.to_container(composed(), resolve=True, enum_to_str=True)
    assert cfg["framework"] == {"name": "torch", "package": "fxtrack.frameworks.torch",
                                "compile": "auto", "compile_mode": "default",
                                "python": None, "launcher": "torchrun"}
    assert cfg["model"] == {"name": "vit", "image_size": 224, "num_classes": 1000, "patch": 16,
                            "layers": 12, "hidden": 768, "heads": 12, "mlp_dim": 3072,
                            "from_run": None}
    assert {k: cfg[k]["name"] for k in ("precision", "scenario", "hardware", "size")} == {
        "precision": "fp32", "scenario": "train", "hardware": "auto", "size": "full"}
    assert cfg["batch_size"] is None and cfg["devices"] == 1 and cfg["seed"] == 0
    assert cfg["tracking"] == {"experiment": "fxtrack", "uri": None}
    assert (cfg["repeats"], cfg["parallel"], cfg["memory"], cfg["runtime"], cfg["quantize"]) == (
        1, "ddp", "none", "native", "none")
    assert (cfg["hardware"]["cpu_threads"], cfg["hardware"]["wait_for_idle_s"]) == (None, 0.0)


@pytest.mark.parametrize("value, expected", [("auto", "auto"), ("true", "true"), ("false", "false"),
                                             ("True", "true")])
def test_compile_choice_is_normalised(value, expected):
    conf, _ = validate(composed(f"framework.compile={value}"))
    assert conf.framework.compile == expected


def test_new_keys_reach_the_job_spec(tmp_path):
    from fxtrack.orchestrator.job import job_spec

    conf, arch = validate(composed("framework=jax", "framework.compile=false", "precision=tf32",
                                   "hardware.cpu_threads=1", "parallel=fsdp", "memory=checkpoint",
                                   "runtime=onnxruntime", "quantize=dynamic_int8",
                                   "scenario=inference", "devices=2", "seed=3", "batch_size=4",
                                   "steps=5", "warmup_steps=2", "verbose=true",
                                   "hardware.wait_for_idle_s=1.5", "hardware.gpu_isolation=error"))
    spec = job_spec(conf, arch, tmp_path)
    assert (spec.framework, spec.package, spec.scenario, spec.devices, spec.launcher) == (
        "jax", "fxtrack.frameworks.jax", "inference", 2, "process")
    assert (spec.seed, spec.batch_size, spec.steps, spec.warmup_steps, spec.verbose) == (
        3, 4, 5, 2, True)
    assert (spec.wait_for_idle_s, spec.gpu_isolation, spec.hardware) == (1.5, "error", "auto")
    assert (spec.compile, spec.compile_request, spec.precision, spec.cpu_threads) == (
        False, "false", "tf32", 1)
    assert (spec.parallel, spec.memory, spec.runtime, spec.quantize) == (
        "fsdp", "checkpoint", "onnxruntime", "dynamic_int8")
    # every field JobSpec reads from the config names a key the typed config has, and holds its
    # value there (the config reaches the worker as JobSpec declares it, not copied by hand)
    plain = OmegaConf.to_container(OmegaConf.structured(conf), resolve=True, enum_to_str=True)
    read = {f.name: f.metadata["config"] for f in dataclasses.fields(JobSpec)
            if "config" in f.metadata}
    assert len(read) >= 20 and "framework.package" in read.values()
    for name, key in read.items():
        value = plain
        for part in key.split("."):
            value = value[part]
        assert getattr(spec, name) == value, (name, key)


@pytest.mark.parametrize("model", architectures.models())
def test_size_tiny_shrinks_every_model_from_the_table(model):
    cfg = composed(f"model={model}", "size=tiny")
    conf, arch = validate(cfg)
    assert arch == architectures.resolve(model, "tiny")
    if arch.family == "resnet":
        assert arch.image_size == 32 and arch.stage_sizes == (3, 4, 6, 3)
    elif arch.family == "llama":  # widths shrink too: the 1B's embedding alone is 263M
        assert (arch.layers, arch.hidden, arch.vocab_size, arch.seq_len) == (2, 64, 256, 32)
    else:
        assert arch.layers == 2
        assert arch.image_size == 32 if arch.family == "vit" else arch.seq_len == 16
    assert not arch.canonical


def test_explicit_model_keys_override_the_table_and_size():
    conf, arch = validate(composed("model=bert", "size=tiny", "model.layers=3", "model.hidden=128",
                                   "model.heads=2"))
    assert (arch.layers, arch.hidden, arch.heads, arch.seq_len) == (3, 128, 2, 16)
    assert arch.mlp_dim == 3072  # untouched keys still come from the table


def test_canonical_models_are_recognised_as_canonical(monkeypatch):
    monkeypatch.setenv("FXTRACK_MEMORY_GIB", "off")  # canonical llama may not fit this machine
    for model in architectures.models():
        assert validate(composed(f"model={model}"))[1].canonical


@pytest.mark.parametrize("overrides, message", [
    (["model=vit", "model.heads=5"], "divisible by model.heads"),
    (["model=vit", "model.image_size=33"], "divisible by model.patch"),
    (["warmup_steps=-1"], "warmup_steps must be >= 0"),  # 0 is allowed (issue 14)
    (["timeout_s=0"], "timeout_s must be a positive number"),
    (["timeout_s=nan"], "timeout_s must be a finite number, got nan"),  # the watchdog
    (["scenario=fit", "scenario.memory_gib=inf"], "scenario.memory_gib must be a finite number"),
    (["scenario=serve", "scenario.rate=nan"], "scenario.rate must be a finite number"),
    (["scenario=serve", "scenario.rate=4", "scenario.duration_s=nan"], "duration_s must be"),
    (["scenario=pipeline", "scenario.loader_workers=-1"], "loader_workers must be >= 0"),
    (["hardware.nodes=2"], "hardware.coordinator .* is required"),
    (["hardware.node_rank=3"], r"hardware.node_rank must be in \[0, 1\)"),
    (["framework.compile=maybe"], "framework.compile must be one of auto, true, false"),
    (["framework.compile_mode=fast"], "framework.compile_mode must be one of default"),
    (["repeats=0"], "repeats must be a positive number"),
    (["hardware.cpu_threads=0"], "cpu_threads must be a positive number"),
])
def test_value_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(composed(*overrides))


def test_an_unknown_key_swept_stops_the_sweep_in_one_line_before_any_work(tmp_path):
    """The one key check's wording for a sweep's job too (its callback composes every job
    first; Hydra would only warn of a callback's error), exit 2, nothing run."""
    proc = run_fxtrack(tmp_path, "-m", "framework=torch,jax", "batchsize=8,16", timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == ("fxtrack: invalid config in job [framework=torch batchsize=8]: "
                           "unknown config key 'batchsize'; did you mean batch_size? (python -m "
                           "fxtrack --help lists the keys)\n"), proc.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_compile_mode_is_torchs_own_setting():
    """framework.compile_mode is declared by torch (a Setting), not a key of every framework."""
    cfg = OmegaConf.to_container(composed("framework=torch", "framework.compile_mode=max-autotune"),
                                 resolve=True)
    assert cfg["framework"]["compile_mode"] == "max-autotune"
    assert "compile_mode" not in OmegaConf.to_container(composed("framework=jax"))["framework"]
    with pytest.raises(Exception, match="compile_mode"):
        validate(composed("framework=jax", "framework.compile_mode=default"))


@pytest.mark.parametrize("override, message", [
    # a key without `+` gets the same did-you-mean as `+key=value`
    ("modle=vit", "unknown config key 'modle'; did you mean model?"),
    ("batchsize=8", "unknown config key 'batchsize'; did you mean batch_size?"),
    ("+batchsize=8", "unknown config key 'batchsize'; did you mean batch_size?"),
    ("model.layerz=2", "unknown config key 'model.layerz'; did you mean model.layers?"),
    ("framework=mxnet", "framework=mxnet: no such option; framework is one of jax, keras, tensorflow, torch"),
    ("model=nonsense", "model=nonsense: no such option; model is one of bert, bert_large, custom, llama, llama_8b, resnet50,"),
    ("precision=fp64", "precision=fp64: no such option; precision is one of bf16, fp16, fp32, tf32"),
    ("parallel=zero3", "Invalid value 'zero3', expected one of [ddp, fsdp]"),
    ("runtime=tvm", "expected one of [native, onnxruntime, tflite, openvino, tensorrt]"),
    ("batch_size=abc", "Value 'abc' of type 'str' could not be converted to Integer"),
    ("batch_size=[", "cannot parse the overrides"),
    ("batch_size=0", "batch_size must be a positive number, got 0"),
    ("steps=-1", "steps must be a positive number, got -1"),
    ("devices=0", "devices must be a positive number, got 0"),
    ("scenario=nonsense", "scenario=nonsense: no such option; scenario is one of checkpoint, converge, fit,"),
])
def test_bad_input_fails_before_any_work(tmp_path, override, message):
    """Every kind of config mistake: one line on stderr, exit status 2, nothing run."""
    proc = run_fxtrack(tmp_path, override, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("fxtrack: invalid config: ") and message in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr  # one line, not Hydra's several
    assert not (tmp_path / "mlflow.db").exists()  # nothing ran, nothing was logged


def test_a_typo_in_a_sweep_is_caught_before_any_work(tmp_path):
    proc = run_fxtrack(tmp_path, "-m", "batchsize=8,16", timeout=120)
    assert proc.returncode == 2 and "did you mean batch_size?" in proc.stderr, proc.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_importing_fxtrack_and_help_import_no_framework():
    code = ("import sys, runpy; sys.argv = ['fxtrack', '--help']\n"
            "try:\n    runpy.run_module('fxtrack', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "heavy = {'torch', 'tensorflow', 'jax', 'flax', 'mlflow'} & set(sys.modules)\n"
            "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "framework: jax, keras, tensorflow, torch" in proc.stdout


def test_defaults_fill_only_what_is_left_open():
    assert architectures.run_defaults("vit", "cpu", None, None, None) == (4, 10, 2)
    assert architectures.run_defaults("vit", "cpu", 2, 3, 0) == (2, 3, 0)  # warmup_steps=0 is a choice


def test_help_names_every_top_level_key():
    import dataclasses

    from fxtrack.cli import usage
    from fxtrack.config.schema import FxtrackConfig

    groups = {"framework", "model", "precision", "scenario", "hardware", "size", "tracking"}
    text = usage()
    missing = [f.name for f in dataclasses.fields(FxtrackConfig)
               if f.name not in groups and f.name not in text]
    assert not missing, missing
