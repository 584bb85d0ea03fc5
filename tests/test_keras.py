"""framework=keras (Keras 3's own compile + train_on_batch) on each Keras backend, CPU, tiny
settings: every model trains with a finite, falling loss, has the parameter count of the other
frameworks' model, computes the loss fxtrack defines, and tags the backend and the compile mode
Keras ran; bf16 and fp16 train; the inference and calibration capabilities run; devices > 1
(and fp16 attention on JAX's CPU) is refused; on the TensorFlow backend the losses are
framework=tensorflow's. KERAS_BACKEND is read once, when keras is imported, so each backend runs in a
subprocess that prepares its environment as the worker does (the framework's
prepare_environment, before the import), then runs jobs through the worker."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import SMALL, run_fxtrack, seed_peak_cache, tiny_arch

from fxtrack.frameworks.base import BF16_KERNEL_FORM
from fxtrack.frameworks.declaration import CAPABILITIES, NotSupported
from fxtrack.frameworks.keras import FRAMEWORK, KERAS_BACKENDS, prepare_environment

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("vit", "resnet50", "bert")
# framework.compile=auto on a CPU: what Keras' jit_compile="auto" picks on each backend
AUTO_ON_CPU = {"jax": "keras-jax:jit", "torch": "keras-torch:eager",
               "tensorflow": "keras-tensorflow:tf.function"}
# one forced mode per backend, where it is quick on a CPU (torch.compile takes minutes)
FORCED = {"jax": ("false", "keras-jax:eager"), "tensorflow": ("true", "keras-tensorflow:xla")}

# Keras' torch backend computes BatchNorm's variance as E[x^2] - E[x]^2 (keras 3.15,
# backend/torch/nn.py moments): over tiny ResNet's last 1x1 maps at batch 2 (2 values per
# channel) it cancels to below zero and the loss turns NaN by the 5th step; batch 4 is stable.
BATCH = {"resnet50": 4}

# Runs in the subprocess: one JSON line per job.
JOBS = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, "tests")
    from conftest import SMALL, job_spec
    from fxtrack.frameworks.keras import FRAMEWORK
    from fxtrack.worker import __main__ as worker

    keras_backend, jobs = sys.argv[1], json.loads(sys.argv[2])

    def spec(model, request="auto", **kw):
        return job_spec("keras", model, steps=7, warmup_steps=1, compile_request=request,
                        framework_settings={"keras_backend": keras_backend},
                        arch=SMALL.get(model, {}), **kw)

    first = spec(jobs[0]["model"])
    worker.prepare_environment(first)
    FRAMEWORK.prepare_environment(first, os.environ)  # before keras is imported (by run)
    for job in jobs:
        s = spec(job["model"], job.get("request", "auto"), devices=job.get("devices", 1),
                 batch_size=job.get("batch_size", 2), precision=job.get("precision", "fp32"),
                 **job.get("spec", {}))
        if job.get("check_loss"):  # the first step's loss against fxtrack's definition
            import keras
            from keras import ops
            from fxtrack.frameworks.keras.backend import KerasBackend
            b = KerasBackend(s)
            b.device_kind()
            b.build(s.batch_size)
            logits = ops.cast(b.model(b.x, training=True), "float32")
            ce = ops.sparse_categorical_crossentropy(b.y, logits, from_logits=True)
            w = b.sample_weight
            expected = float(ops.sum(ce * w) / ops.sum(w)) if w is not None else float(ops.mean(ce))
            print(json.dumps({"model": job["model"], "expected": expected,
                              "got": b.loss_value(b.train_step())}), flush=True)
            continue
        if job.get("native"):  # the same job in the native framework
            r = worker.run(job_spec(job["native"], job["model"], steps=7, warmup_steps=1,
                                    batch_size=s.batch_size, arch=SMALL.get(job["model"], {})))
            print(json.dumps({"model": job["model"], "native": r.series.get("loss", [])}),
                  flush=True)
            continue
        if job.get("inference"):  # the declared capabilities, as the scenarios will call them
            from fxtrack import flops
            from fxtrack.frameworks.keras import devices
            from fxtrack.frameworks.keras.backend import KerasBackend
            from fxtrack.worker.protocol import Result
            from fxtrack.scenarios.timed import run_timed
            b, r = KerasBackend(s), Result(result_id="inference")
            module = FRAMEWORK.capability("inference")
            run_timed(b, r, lambda: module.prepare(b), flops.forward_flops_per_sample(b.arch))
            print(json.dumps({"model": job["model"], "inference": r.metrics,
                              "tflops": FRAMEWORK.capability("calibration").matmul_tflops(b),
                              "compile_mode": b.device_tags()["compile_mode"]}), flush=True)
            continue
        if job.get("slots"):  # continuous batching's slots through conftest's script
            import numpy as np
            from keras import ops
            from conftest import SLOT_PROMPTS, drive_slots
            from fxtrack.frameworks.keras.backend import KerasBackend
            b = KerasBackend(s)
            b.device_kind()
            b.build(2)
            # x10 the N(0, 0.02) weights: the layers, not the last token's embedding, pick
            b.model.set_weights([w * 10 for w in b.model.get_weights()])
            slots = FRAMEWORK.capability("slot_decode").prepare_slots(b, 2, [16, 20], 7)
            for padded in slots.buckets:  # the serve warm-up: every bucket into every slot
                for slot in range(2):
                    slots.prefill(slot, padded)
            slots.step([0, 1])
            counted = []  # XLA compilations while the script runs (JAX)
            if keras_backend == "jax":
                import jax
                jax.monitoring.register_event_duration_secs_listener(
                    lambda event, *a, **k: counted.append(event)
                    if event == "/jax/core/compile/backend_compile_duration" else None)
            got = drive_slots(slots)
            compiles = len(counted)  # before the reference's own
            traces = ([f.experimental_get_tracing_count() for f in (slots._prefill, slots._step)]
                      if keras_backend == "tensorflow" else None)
            greedy = {}  # each prompt alone: the full causal forward on one (1, 27) buffer
            for name, length in SLOT_PROMPTS.items():
                seq = np.zeros((1, 27), np.int32)
                seq[:, :length] = slots.ids[:, :length]
                for i in range(len(got[name])):
                    logits = ops.convert_to_numpy(b.model(ops.convert_to_tensor(seq)))
                    seq[0, length + i] = int(np.argmax(logits[0, length + i - 1]))
                greedy[name] = seq[0, length:length + len(got[name])].tolist()
            print(json.dumps({"model": job["model"], "slots": got, "greedy": greedy,
                              "compiled": b.compiled, "compiles": compiles,
                              "traces": traces}), flush=True)
            continue
        from fxtrack.frameworks import xla_bf16
        xla_bf16.ENABLED = not job.get("plain_dots")  # False: XLA's own dots, to compare with
        xla_bf16.CONVS_AS_MATMULS = not job.get("plain_convs")  # and XLA's own convolutions
        r = worker.run(s)
        xla_bf16.ENABLED = xla_bf16.CONVS_AS_MATMULS = True
        print(json.dumps({"model": job["model"], "request": job.get("request", "auto"),
                          "devices": s.devices, "status": r.status, "error": r.error,
                          "guard": r.guard, "losses": r.series.get("loss", []),
                          "params": r.metrics.get("param_count"), "tags": r.tags,
                          "metrics": r.metrics}), flush=True)
""")


def run_jobs(keras_backend: str, jobs: list[dict]) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", JOBS, keras_backend, json.dumps(jobs)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def torch_param_count(model: str) -> int:
    """The other frameworks' count for the tiny model (tests/test_torch.py checks torch's
    canonical counts, tests/test_tensorflow.py the shared Keras models')."""
    torch_models = pytest.importorskip("fxtrack.frameworks.torch.models")
    return sum(p.numel() for p in torch_models.build(tiny_arch(model, **SMALL.get(model, {}))).parameters()
               if p.requires_grad)


@pytest.fixture(scope="module")
def torch_counts():
    pytest.importorskip("torch")
    return {m: torch_param_count(m) for m in MODELS}


def trained_here(keras_backend: str) -> tuple[str, ...]:
    """Every model on each backend, but on the one framework=keras runs by default, whose
    models tests/test_conformance.py trains for 20 steps with their parameter counts: there one
    model for the tags and the compile mode."""
    return ("vit",) if keras_backend == FRAMEWORK.settings["keras_backend"].default else MODELS


@pytest.mark.slow
@pytest.mark.parametrize("keras_backend", KERAS_BACKENDS)
def test_every_model_trains_on_each_backend(keras_backend, torch_counts):
    pytest.importorskip(keras_backend)
    trained = trained_here(keras_backend)
    jobs = [{"model": m, "batch_size": BATCH.get(m, 2)} for m in trained]
    jobs.append({"model": "bert", "check_loss": True})
    jobs.append({"model": "resnet50", "inference": True})
    if keras_backend in FORCED:
        jobs.append({"model": "vit", "request": FORCED[keras_backend][0]})
    if keras_backend == "jax":
        jobs += [{"model": "vit", "devices": 2}, {"model": "vit", "precision": "fp16"}]
        # bf16 dense layers in XLA:CPU's kernel form, and the same with XLA's own dots
        jobs += [{"model": "bert", "precision": "bf16"},
                 {"model": "bert", "precision": "bf16", "plain_dots": True}]
        # the ResNet's 1x1 convolutions as matmuls, and as XLA's convolutions
        jobs += [{"model": "resnet50", "batch_size": 4},
                 {"model": "resnet50", "batch_size": 4, "plain_convs": True}]
    else:  # mixed precision: Keras' dtype policy, fp16 with its LossScaleOptimizer
        jobs += [{"model": "vit", "precision": "bf16"}, {"model": "vit", "precision": "fp16"}]
    if keras_backend == "tensorflow":  # same backend, same seed: the very same numbers
        jobs += [{"model": m, "native": "tensorflow", "batch_size": BATCH.get(m, 2)}
                 for m in ("resnet50", "bert")]
    out = run_jobs(keras_backend, jobs)
    assert len(out) == len(jobs), out
    for r in out[:len(trained)]:
        assert r["status"] == "FINISHED", r["error"]
        losses = r["losses"]
        assert len(losses) == 8 and all(math.isfinite(x) for x in losses), r
        assert losses[-1] < 0.9 * losses[0], (r["model"], losses)
        assert r["guard"] == "ok", r["guard"]
        assert r["params"] == torch_counts[r["model"]], r["model"]
        tags = r["tags"]
        assert tags["keras_backend"] == keras_backend and tags["keras_version"]
        assert tags["keras_backend_version"] and tags["framework_version"] == tags["keras_version"]
        assert tags["compile_mode"] == AUTO_ON_CPU[keras_backend], tags
    loss, inference = out[len(trained):len(trained) + 2]
    assert abs(loss["got"] - loss["expected"]) < 1e-4 * abs(loss["expected"]), loss
    assert inference["inference"]["throughput_samples_per_s"] > 0 and 0 < inference["tflops"] < 1e4
    assert inference["compile_mode"] == AUTO_ON_CPU[keras_backend]
    rest = out[len(trained) + 2:]
    if keras_backend in FORCED:
        forced = rest.pop(0)
        assert forced["status"] == "FINISHED", forced["error"]
        assert forced["tags"]["compile_mode"] == FORCED[keras_backend][1]
    if keras_backend == "jax":
        two, fp16 = rest[:2]
        assert two["status"] == "FAILED" and two["error"].startswith("NotSupported: devices > 1")
        assert fp16["status"] == "FAILED" and "fp16 x fp16 -> fp32 dot" in fp16["error"]
    else:
        for mixed in rest[:2]:  # the first fp16 steps may be skipped while the scale backs off
            assert mixed["status"] == "FINISHED", mixed["error"]
            assert all(math.isfinite(x) for x in mixed["losses"])
            assert mixed["losses"][-1] < mixed["losses"][0], mixed
    rest = rest[2:]
    if keras_backend == "jax":  # the kernel form learns as XLA's own bf16 dots do
        fast, plain, pointwise, convolved = rest
        for r in rest:
            assert r["status"] == "FINISHED", r["error"]
        assert fast["tags"]["matmul_form"] == BF16_KERNEL_FORM != plain["tags"]["matmul_form"]
        assert fast["losses"][:3] == pytest.approx(plain["losses"][:3], rel=2e-2)
        assert fast["losses"][-1] < fast["losses"][0], fast["losses"]
        # the same sums at fp32: the same first losses, to rounding (later ones drift apart:
        # tiny ResNet's BatchNorms over 1x1 maps amplify rounding, see tests/test_jax.py)
        from fxtrack.frameworks.xla_bf16 import POINTWISE_AS_MATMUL
        assert pointwise["tags"]["conv_form"] == POINTWISE_AS_MATMUL != convolved["tags"]["conv_form"]
        assert pointwise["losses"][:3] == pytest.approx(convolved["losses"][:3], rel=1e-4)
        assert pointwise["params"] == convolved["params"] == torch_counts["resnet50"]
    if keras_backend == "tensorflow":
        # train_on_batch under Keras' own tf.function trains exactly as fxtrack's GradientTape
        # step: the same initial weights, batch, loss and optimiser updates
        keras_losses = {r["model"]: r["losses"] for r in out[:len(trained)]}
        for native in rest:
            assert native["native"] == pytest.approx(keras_losses[native["model"]], rel=1e-5)


class Spec:  # the fields prepare_environment reads
    def __init__(self, keras_backend=None, hardware="cpu", devices=1, cpu_threads=None):
        self.framework_settings = {} if keras_backend is None else {"keras_backend": keras_backend}
        self.hardware, self.devices, self.cpu_threads = hardware, devices, cpu_threads


def test_prepare_environment_sets_the_backend_and_what_it_reads_at_import():
    env: dict[str, str] = {}
    prepare_environment(Spec(devices=2), env)  # the default backend
    assert env["KERAS_BACKEND"] == "jax" and env["JAX_PLATFORMS"] == "cpu"
    assert "--xla_force_host_platform_device_count=2" in env["XLA_FLAGS"]
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    env = {}
    prepare_environment(Spec(cpu_threads=1), env)  # XLA:CPU at one thread, as framework=jax
    assert "--xla_cpu_multi_thread_eigen=false" in env["XLA_FLAGS"]
    env = {}
    prepare_environment(Spec("torch"), env)
    assert env["KERAS_BACKEND"] == "torch" and env["KERAS_TORCH_DEVICE"] == "cpu"
    assert "JAX_PLATFORMS" not in env
    env = {}
    prepare_environment(Spec("tensorflow", hardware="gpu"), env)
    assert env["KERAS_BACKEND"] == "tensorflow" and env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert "CUDA_VISIBLE_DEVICES" not in env
    with pytest.raises(ValueError, match="keras_backend must be one of jax, torch, tensorflow"):
        prepare_environment(Spec("mxnet"), {})


def test_declaration_names_every_capability_and_imports_no_framework():
    assert set(FRAMEWORK.capabilities) | set(FRAMEWORK.absent) == set(CAPABILITIES)
    assert FRAMEWORK.settings["keras_backend"].choices == KERAS_BACKENDS
    with pytest.raises(NotSupported, match="checkpoint is not supported by keras"):
        FRAMEWORK.capability("checkpoint")
    # model=custom reads the same model.keras builder as framework=tensorflow
    assert FRAMEWORK.has("user_model") and FRAMEWORK.builder_key == "keras"
    code = ("import sys, fxtrack.frameworks.keras; "
            "print([m for m in ('keras', 'jax', 'torch', 'tensorflow') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def _keras_config_composes() -> bool:
    """framework=keras through Hydra needs what the framework wiring brings: the ``package:``
    key and the per-framework schema for ``framework.keras_backend``."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from fxtrack.config import register
    from fxtrack.paths import CONF_DIR

    register()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=["framework=keras",
                                                           "framework.keras_backend=jax"])
            OmegaConf.to_object(cfg)
    except Exception:  # noqa: BLE001 -- any refusal means the wiring is not there yet
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _keras_config_composes(),
                    reason="conf/framework/keras.yaml does not compose yet: needs the worker's "
                           "framework declarations (package:, framework.keras_backend schema)")
def test_end_to_end_run_logs_the_torch_param_count(tmp_path, torch_counts):
    """The keras run's logged count against torch's model of the same tiny ViT, built here
    (``torch_counts``: the model a torch worker builds, whose reported count is
    tests/test_conformance.py's check), not by a second fxtrack run."""
    mlflow = pytest.importorskip("mlflow")
    proc = run_fxtrack(tmp_path, "framework=keras", "framework.keras_backend=jax", "model=vit",
                       "size=tiny", "steps=3", "warmup_steps=1", "hardware=cpu",
                       env=seed_peak_cache(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("fxtrack")
    # the benchmark run (a single run: no parent)
    (run,) = [r for r in client.search_runs([exp.experiment_id])
              if "fxtrack.framework" in r.data.tags]
    assert run.data.tags["fxtrack.framework"] == "keras"
    assert run.data.tags["fxtrack.keras_backend"] == "jax"
    assert run.data.tags["fxtrack.compile_mode"] == "keras-jax:jit"
    assert run.data.metrics["param_count"] == torch_counts["vit"]


def test_llama_trains_and_generates_on_jax():
    """The tiny Llama through Keras' own train_on_batch on JAX (not in MODELS' sweep, which
    is slow already): finishes, the loss falls, the table's parameter count, and the attention
    tag says JAX grouped the KV heads itself; fp16 is refused on a CPU as for the other
    transformers (measured without the refusal: XLA:CPU's "F16_F16_F32 ... not supported by
    dot_general"). scenario=generate: the jitted cached decode gives the uncached tokens."""
    pytest.importorskip("jax")
    from fxtrack.architectures import llama_params

    gen = {"scenario": "generate", "runner": "fxtrack.scenarios.generate.runner:run",
           "options": {"prompt_len": 8, "new_tokens": 8}}
    r, fp16, g = run_jobs("jax", [{"model": "llama"}, {"model": "llama", "precision": "fp16"},
                                  {"model": "llama", "spec": gen}])
    assert g["status"] == "FINISHED" and g["guard"] == "ok", (g["error"], g["guard"])
    assert g["metrics"]["decode_tokens_per_s"] > 0 and g["metrics"]["kv_cache_mib"] > 0
    assert g["tags"]["compile_mode"] == "keras-jax:jit"
    assert fp16["status"] == "FAILED" and "fp16 x fp16 -> fp32 dot" in fp16["error"]
    assert r["status"] == "FINISHED", r["error"]
    losses = r["losses"]
    assert len(losses) == 8 and all(math.isfinite(x) for x in losses), r
    assert max(losses[1:]) < losses[0], losses  # AdamW at 1e-4: a slow, steady fall
    assert r["guard"] == "ok", r["guard"]
    assert r["params"] == llama_params(tiny_arch("llama"))["total"]
    assert r["tags"]["compile_mode"] == AUTO_ON_CPU["jax"]
    assert r["tags"]["attention"] == "keras.ops.dot_product_attention:jax.nn.dot_product_attention:xla:causal:gqa-native"


@pytest.mark.parametrize("keras_backend, request_", [("jax", "auto"), ("torch", "auto"),
                                                     ("tensorflow", "true")])
def test_continuous_slots_decode_each_request_as_its_own_greedy_run(keras_backend, request_):
    """scenario.batching=continuous's slots (fxtrack.frameworks.keras.slots) on each Keras
    backend (jit on JAX, eager on torch, XLA on TensorFlow): requests of different prompt
    lengths (padded to their buckets) admitted while others decode, a freed slot reused, each
    request's tokens equal to a greedy run of its own prompt alone; after the warm-up the
    script compiles nothing (JAX's count of XLA compilations; on TensorFlow its tf.function
    traces, one per prompt bucket and one step, which do not show XLA's own recompiles)."""
    pytest.importorskip(keras_backend)
    (r,) = run_jobs(keras_backend, [{"model": "llama", "slots": True, "request": request_}])
    assert r["compiled"] == (keras_backend != "torch")
    for name, tokens in r["slots"].items():
        assert tokens == r["greedy"][name], name
    assert [len(t) for t in r["slots"].values()] == [6, 7, 3]
    assert len(set(r["slots"]["a"] + r["slots"]["b"])) > 2  # not one repeated token
    assert r["compiles"] == 0
    if keras_backend == "tensorflow":
        assert r["traces"] == [2, 1]
