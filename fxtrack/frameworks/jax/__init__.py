"""JAX (Flax NNX, Optax): what it declares (no jax import here; fxtrack.frameworks.declaration)."""

from __future__ import annotations

from typing import Any, MutableMapping

from fxtrack import families, policy
from fxtrack.frameworks.declaration import (CompileRule, Framework, HeldTwice, Limit, Setting,
                                            append_xla_flag)


def _own_builder(family: str) -> bool:
    """Whether the family's models are a builder's own (model=custom): its family says so."""
    return bool(family) and families.get(family).user is not None


def prepare_environment(spec: Any, env: MutableMapping[str, str]) -> None:
    """What JAX reads when it starts: platform, allocator, XLA flags (the worker has already set
    the framework-neutral thread variables and CPU affinity)."""
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # peak memory, not the pool
    if spec.hardware == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        if spec.devices > 1:  # N host devices stand in for N accelerators
            append_xla_flag(env, f"--xla_force_host_platform_device_count={spec.devices}")
    elif spec.devices * spec.nodes > 1:
        # Overlap the gradient all-reduce with the backward pass (XLA:GPU's latency-hiding
        # scheduler; TF's and torch's DDP overlap theirs by default). Read only by XLA:GPU.
        append_xla_flag(env, "--xla_gpu_enable_latency_hiding_scheduler=true")
    # XLA:CPU sizes its Eigen pool from the affinity and takes no thread count; at one thread
    # its multi-threaded Eigen path is switched off instead.
    if policy.threads_per_process(policy.cpu_threads(spec.cpu_threads)) == 1:
        append_xla_flag(env, "--xla_cpu_multi_thread_eigen=false")


# Where each compile rule's figure, interval, machine and command live (or its source)
AUTO = "docs/fairness.md#what-frameworkcompileauto-means-each-fxtrackframeworksfw__init__py"

FRAMEWORK = Framework(
    name="jax",
    words="JAX",
    backend="fxtrack.frameworks.jax.backend:JaxBackend",
    extra="jax",
    report_order=30,
    colour="#4285f4",
    # op-by-op dispatch is JAX's debugging mode, never its fast path
    compile_rules=(CompileRule(True, "jax always jits", AUTO),),
    tune_modes=(True,),  # framework.compile=tune: jit is the one mode, nothing to time
    compiled_tag="jit",
    uncompiled_tag="op-by-op",
    prepare_environment=prepare_environment,
    # a step without donation keeps the old training state alive beside the new one
    held_twice=HeldTwice("jax_donation", "off", "JAX without donation (framework.donate=false); "
                         "with the default (auto) it is donated"),
    settings={
        # JAX's documented idiom for a training step; docs/measurements.md has the XLA:CPU cost.
        "donate": Setting("auto", ("auto", "true", "false"),
                          "the jitted step donates its state (donate_argnums); auto: on every "
                          "device, JAX's documented idiom; false: measured 2-5% faster on XLA:CPU"),
    },
    capabilities={
        "converge": "fxtrack.frameworks.jax.converge",
        "converge_devices": "fxtrack.frameworks.jax.converge",
        "profile": "fxtrack.frameworks.jax.profile",
        "inference": "fxtrack.frameworks.jax.inference",
        "pipeline": "fxtrack.frameworks.jax.pipeline",
        "checkpoint": "fxtrack.frameworks.jax.checkpoint",
        "serving_export": "fxtrack.frameworks.jax.serving",
        "onnx_export": "fxtrack.frameworks.jax.deployment",
        "sharded_state": "fxtrack.frameworks.jax.parallel",
        "remat": "fxtrack.frameworks.jax.models",
        "calibration": "fxtrack.frameworks.jax.devices",
        "user_model": "fxtrack.frameworks.jax.user_model",
        "user_serving_export": "fxtrack.frameworks.jax.user_model",
        "user_sharded_state": "fxtrack.frameworks.jax.user_model",
        "user_remat": "fxtrack.frameworks.jax.user_model",
        "generate": "fxtrack.frameworks.jax.generate",
        "serve_buckets": "fxtrack.frameworks.jax.buckets",
        "slot_decode": "fxtrack.frameworks.jax.slots",
    },
    limits=(
        # jax2onnx (the deploy-jax extra) converts fxtrack's own models from their pure
        # functions; a user's nnx.Module would need its own wiring, not written yet (the runtimes
        # without onnx_export, tflite and native, are refused by their capability first)
        Limit(lambda c: f"runtime={c.runtime} with model=custom",
              lambda c: _own_builder(c.family) and c.runtime != "native",
              "exporting a user's nnx.Module to ONNX is not wired yet; use framework=torch or "
              "tensorflow for your model's runtimes"),
    ),
    absent={
        "tflite_export": "TFLite export is TensorFlow's (jax2tf would convert through "
                         "TensorFlow); use runtime=onnxruntime (for model=custom: "
                         "framework=tensorflow)",
        "native_int8": "no maintained dynamic int8 path in the framework itself; use "
                       "runtime=onnxruntime quantize=dynamic_int8 (for model=custom: "
                       "framework=torch)",
    },
)
