"""Keras 3's own training path (``model.compile`` + ``train_on_batch``) on the JAX, PyTorch or
TensorFlow backend (``framework.keras_backend``): what it declares (no keras, jax, torch or
tensorflow import here; fxtrack.frameworks.declaration). The models are the ones
framework=tensorflow builds (fxtrack.frameworks.keras_models)."""

from __future__ import annotations

from typing import Any, MutableMapping

from fxtrack import policy
from fxtrack.frameworks.declaration import CompileRule, Framework, Limit, Setting, append_xla_flag
from fxtrack.frameworks.tf_import import skip_optional_jax

KERAS_BACKENDS = ("jax", "torch", "tensorflow")
ONE_DEVICE = ("keras.distribution.DataParallel (JAX only) shards one global batch with batch "
              "statistics over all of it, not the per-device batches and BatchNorm of the other "
              "frameworks' DDP")
# What a compiled / uncompiled Keras step is on each backend: the fxtrack.compile_mode tag
# keras-<backend>:<mode>. On TensorFlow an uncompiled step is still a tf.function graph, on JAX
# and torch it runs op by op.
COMPILED_MODES = {"jax": "jit", "torch": "torch.compile", "tensorflow": "xla"}
UNCOMPILED_MODES = {"jax": "eager", "torch": "eager", "tensorflow": "tf.function"}


def keras_backend(spec: Any) -> str:
    """The Keras backend a job asked for (``framework.keras_backend``), checked."""
    name = spec.framework_settings.get("keras_backend", "jax")
    if name not in KERAS_BACKENDS:
        raise ValueError(f"framework.keras_backend must be one of {', '.join(KERAS_BACKENDS)}, "
                         f"got {name!r}")
    return name


def prepare_environment(spec: Any, env: MutableMapping[str, str]) -> None:
    """KERAS_BACKEND (Keras reads it once, at import), and what that backend reads when it
    starts: platform, allocator, device."""
    name = keras_backend(spec)
    env["KERAS_BACKEND"] = name
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX: peak memory, not the pool
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")  # TF: likewise
    if name == "tensorflow":
        skip_optional_jax()  # TensorFlow's import brought JAX along for nothing
    # XLA:CPU takes no thread count: at one thread its multi-threaded Eigen path is switched off
    # (as framework=jax does)
    if name == "jax" and policy.threads_per_process(policy.cpu_threads(spec.cpu_threads)) == 1:
        append_xla_flag(env, "--xla_cpu_multi_thread_eigen=false")
    if spec.hardware != "cpu":
        return
    env["CUDA_VISIBLE_DEVICES"] = ""
    if name == "jax":
        env["JAX_PLATFORMS"] = "cpu"
        if spec.devices > 1:  # N host devices stand in for N accelerators
            append_xla_flag(env, f"--xla_force_host_platform_device_count={spec.devices}")
    elif name == "torch":
        env["KERAS_TORCH_DEVICE"] = "cpu"  # Keras' torch backend picks CUDA at import otherwise


# Where each compile rule's figure, interval, machine and command live (or its source)
AUTO = "docs/fairness.md#what-frameworkcompileauto-means-each-fxtrackframeworksfw__init__py"

FRAMEWORK = Framework(
    name="keras",
    words="Keras",
    backend="fxtrack.frameworks.keras.backend:KerasBackend",
    extra="keras",
    report_order=40,
    colour="#8e24aa",
    # Keras' own default, compile(jit_compile="auto"): jax.jit on JAX; XLA on TensorFlow where
    # a GPU is present (a plain tf.function on a CPU-only machine); eager on torch (Keras does
    # not torch.compile unless asked). true / false force jit_compile=True / False; the
    # compile_mode tag (keras-<backend>:<mode>) says what ran, read back from model.jit_compile.
    compile_rules=(CompileRule(True, "keras chooses (compile(jit_compile='auto'): jit on jax, "
                                     "XLA on tensorflow with a GPU, eager on torch)",
                               AUTO),),
    compiled_tag=lambda s: f"keras-{s['keras_backend']}:{COMPILED_MODES[s['keras_backend']]}",
    uncompiled_tag=lambda s: f"keras-{s['keras_backend']}:{UNCOMPILED_MODES[s['keras_backend']]}",
    # Keras' first train_on_batch always builds: the optimiser's variables, a symbolic pass over
    # the model and, on TensorFlow, a tf.function trace even without XLA.
    uncompiled_builds_graph=True,
    model_key="keras",  # model=custom: the same keras.Model builder as framework=tensorflow's
    capabilities={
        "converge": "fxtrack.frameworks.keras.converge",
        "profile": "fxtrack.frameworks.keras.profile",
        "inference": "fxtrack.frameworks.keras.inference",
        "calibration": "fxtrack.frameworks.keras.devices",
        "user_model": "fxtrack.frameworks.keras.user_model",
        "generate": "fxtrack.frameworks.keras.generate",
        "serve_buckets": "fxtrack.frameworks.keras.buckets",
        "slot_decode": "fxtrack.frameworks.keras.slots",
    },
    absent={
        "user_serving_export": "framework=keras has no checkpoint path yet, for any model; "
                               "framework=tensorflow checkpoints and exports the same "
                               "model.keras builder",
        "pipeline": "not implemented for keras yet",
        "checkpoint": "not implemented for keras yet",
        "serving_export": "not implemented for keras yet",
        "onnx_export": "not implemented for keras yet; use framework=tensorflow (it reads "
                       "the same model.keras builder) or torch",
        "tflite_export": "TFLite export is TensorFlow's; use framework=tensorflow (it reads the "
                         "same model.keras builder)",
        "native_int8": "not implemented for keras yet; use framework=tensorflow runtime=tflite "
                       "quantize=dynamic_int8",
        "sharded_state": "not implemented for keras yet (keras.distribution.ModelParallel on "
                         "JAX could shard it); use framework=torch or framework=jax",
        "remat": "not implemented for keras yet (keras.RematScope fails inside tf.function on "
                 "the TensorFlow backend); use framework=torch or framework=jax",
        "user_sharded_state": "no sharded state for any model (see sharded_state); use "
                              "framework=torch or framework=jax",
        "user_remat": "no rematerialisation for any model (see remat); use framework=torch or "
                      "framework=jax",
        "converge_devices": "keras runs on one device here (see devices > 1); use "
                            "framework=torch or framework=jax",
    },
    settings={
        "keras_backend": Setting("jax", KERAS_BACKENDS,
                                 "the backend Keras runs on (KERAS_BACKEND)", identity=True),
    },
    limits=(Limit("devices > 1", lambda c: c.devices * c.nodes > 1, ONE_DEVICE),),
    prepare_environment=prepare_environment,
)
