"""TensorFlow (Keras 3 models on tf.function / XLA): what it declares (no tensorflow import here;
fxtrack.frameworks.declaration)."""

from typing import Any, MutableMapping

from fxtrack.frameworks.declaration import CompileRule, Framework, Limit
from fxtrack.frameworks.tf_import import skip_optional_jax

# Refused before any work (the Limit below) and by parallel.strategy as a backstop.
ONE_REPLICA_PER_CPU_WORKER = ("its MultiWorkerMirroredStrategy runs one replica per CPU worker; "
                              "use devices=1 per node")


def prepare_environment(spec: Any, env: MutableMapping[str, str]) -> None:
    """What TensorFlow reads when it starts: grow GPU memory as needed (the peak, not the pool);
    and no JAX imported with it."""
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    skip_optional_jax()


# Where each compile rule's figure, interval, machine and command live (or its source)
PER_FAMILY = "docs/measurements.md#compileauto-per-model-family-and-compiletune-2026-12-01"
TF_CPU = "docs/measurements.md#xla-on-a-cpu-tensorflow-2026-11-30"
# the table re-derived at the reference configs (fp32, a quiet CPU)
REFERENCE = "docs/measurements.md#bf16-on-a-cpu-the-compile-rule-and-the-reference-rows-2026-12-03"
AUTO = "docs/fairness.md#what-frameworkcompileauto-means-each-fxtrackframeworksfw__init__py"

FRAMEWORK = Framework(
    name="tensorflow",
    words="TensorFlow",
    backend="fxtrack.frameworks.tensorflow.backend:TensorFlowBackend",
    extra="tensorflow",
    report_order=20,
    colour="#ff8f00",
    # framework.compile=auto per device kind and model family, the first match wins; every
    # row links the docs section holding its figure, interval, machine and command
    compile_rules=(
        CompileRule(True, "XLA on GPU (Keras' own jit_compile='auto' there)", AUTO,
                    device_kind="gpu"),
        CompileRule(False, "tf.function on CPU for ResNet-50: XLA measured slower", PER_FAMILY,
                    device_kind="cpu", family="resnet"),
        CompileRule(True, "XLA on CPU for ViT: measured faster than tf.function", PER_FAMILY,
                    device_kind="cpu", family="vit"),
        CompileRule(True, "XLA on CPU for BERT: measured faster than tf.function", REFERENCE,
                    device_kind="cpu", family="bert"),
        CompileRule(True, "XLA on CPU for Llama: measured faster than tf.function", REFERENCE,
                    device_kind="cpu", family="llama"),
        CompileRule(False, "tf.function on CPU for a user's model, as Keras' jit_compile='auto' "
                           "(framework.compile=tune times both)", TF_CPU, device_kind="cpu",
                    family="custom"),
    ),
    compiled_tag="xla",
    uncompiled_tag="tf.function",
    model_key="keras",  # model=custom: a keras.Model, as framework=keras will read
    prepare_environment=prepare_environment,
    uncompiled_builds_graph=True,  # a plain tf.function still traces a graph on the first step
    capabilities={
        "converge": "fxtrack.frameworks.tensorflow.converge",
        "profile": "fxtrack.frameworks.tensorflow.profile",
        "inference": "fxtrack.frameworks.tensorflow.inference",
        "pipeline": "fxtrack.frameworks.tensorflow.pipeline",
        "checkpoint": "fxtrack.frameworks.tensorflow.checkpoint",
        "serving_export": "fxtrack.frameworks.tensorflow.serving",
        "onnx_export": "fxtrack.frameworks.tensorflow.deployment",
        "tflite_export": "fxtrack.frameworks.tensorflow.deployment",
        "calibration": "fxtrack.frameworks.tensorflow.devices",
        "user_model": "fxtrack.frameworks.tensorflow.user_model",
        "user_serving_export": "fxtrack.frameworks.tensorflow.user_model",
        "generate": "fxtrack.frameworks.tensorflow.generate",
        "serve_buckets": "fxtrack.frameworks.tensorflow.buckets",
        "slot_decode": "fxtrack.frameworks.tensorflow.slots",
    },
    limits=(
        Limit("hardware.nodes > 1 with devices > 1 on a CPU",
              lambda c: c.nodes > 1 and c.devices > 1 and c.device_kind == "cpu",
              ONE_REPLICA_PER_CPU_WORKER),
    ),
    absent={
        "native_int8": "no maintained dynamic int8 path in the framework itself; use "
                       "runtime=tflite or runtime=onnxruntime quantize=dynamic_int8",
        "sharded_state": "tf.distribute has no sharded-state strategy (ParameterServerStrategy "
                         "shards variables over CPU servers, not accelerators; DTensor was "
                         "removed); use framework=torch or framework=jax",
        "remat": "keras.RematScope's tf.custom_gradient rejects keyword arguments (training=) "
                 "inside tf.function; use framework=torch or framework=jax",
        "user_sharded_state": "no sharded-state strategy for any model (see sharded_state); "
                              "use framework=torch or framework=jax",
        "user_remat": "no rematerialisation for any model (see remat); use framework=torch "
                      "or framework=jax",
        "converge_devices": "not implemented for tensorflow yet: its converge step runs outside "
                            "a tf.distribute strategy; use framework=torch or framework=jax",
    },
)
