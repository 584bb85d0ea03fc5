"""Device choice, fairness settings, sync, memory counters and device tags for Keras, on whichever
backend it was imported with. Each function asks ``keras.backend.backend()`` and imports that
framework only (already imported by Keras itself)."""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable, Optional

import keras

from fxtrack.frameworks.base import PeakMemory
from fxtrack.measure import matmul_probe


def backend_name() -> str:
    return keras.backend.backend()


def backend_version() -> str:
    """The version of the framework under Keras (jax, torch or tensorflow)."""
    return importlib.import_module(backend_name()).__version__


def configure(precision: str, threads: int) -> dict[str, str]:
    """The fairness policy (fxtrack.policy) in the backend's own terms, as the native framework
    packages apply it: strict IEEE fp32 matmuls unless ``precision=tf32``; intra-op threads
    sized to ``threads`` (XLA:CPU under JAX sizes its pools from the CPU affinity the worker
    set). Returns the settings read back, as run tags."""
    tf32, name = precision == "tf32", backend_name()
    if name == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "tensorfloat32" if tf32 else "highest")
        exact = jax.config.jax_default_matmul_precision in ("highest", "float32")
        used = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    elif name == "torch":
        import torch

        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = True  # static shapes, as XLA's autotuning assumes
        torch.set_num_threads(threads)
        exact, used = torch.get_float32_matmul_precision() == "highest", torch.get_num_threads()
    else:
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(tf32)
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:  # runtime already initialised (a second build in one process)
            pass
        exact = not tf.config.experimental.tensor_float_32_execution_enabled()
        used = tf.config.threading.get_intra_op_parallelism_threads()
    return {"matmul_precision": "fp32" if exact else "tf32", "cpu_threads": str(used)}


def gpu_names() -> list[str]:
    """The GPUs the backend sees (none when hardware=cpu hid them before import)."""
    name = backend_name()
    if name == "jax":
        import jax

        try:
            return [d.device_kind for d in jax.local_devices(backend="gpu")]
        except RuntimeError:  # no CUDA backend in this jaxlib, or no device behind it
            return []
    if name == "torch":
        import torch

        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    import tensorflow as tf

    return [tf.config.experimental.get_device_details(g).get("device_name", "gpu")
            for g in tf.config.list_physical_devices("GPU")]


def select(hardware: str) -> str:
    """``auto`` | ``cpu`` | ``gpu`` -> ``"gpu:0"`` or ``"cpu:0"``: the backend's default device,
    where the model and batch are placed."""
    gpus = gpu_names() if hardware in ("gpu", "auto") else []
    if hardware == "gpu" and not gpus:
        raise RuntimeError(f"hardware=gpu, but Keras' {backend_name()} backend sees no GPU "
                           f"({backend_name()} {backend_version()}, keras {keras.__version__})")
    return "gpu:0" if gpus else "cpu:0"


def sync(device: str, variables: list) -> None:
    """Wait until the step's updates of ``variables`` are done. train_on_batch has already
    fetched the loss to the host; what may still run: op-by-op JAX dispatch (async), and queued
    GPU kernels under torch and TensorFlow."""
    name = backend_name()
    if name == "jax":
        import jax

        jax.block_until_ready([v.value for v in variables])
    elif "gpu" in device:
        if name == "torch":
            import torch

            torch.cuda.synchronize()
        else:
            import tensorflow as tf

            tf.test.experimental.sync_devices()


def peak_memory(device: str) -> Optional[PeakMemory]:
    """The backend allocator's peaks on the GPU, named as that framework's own backend names
    them (fxtrack/frameworks/<name>/devices.py); None on a CPU (no such counter)."""
    if "gpu" not in device:
        return None
    name = backend_name()
    if name == "jax":
        import jax

        return PeakMemory.from_jax_stats(jax.local_devices(backend="gpu")[0].memory_stats())
    if name == "torch":
        import torch

        return PeakMemory("torch.max_memory_allocated", int(torch.cuda.max_memory_allocated()),
                          "torch.max_memory_reserved", int(torch.cuda.max_memory_reserved()))
    import tensorflow as tf

    return PeakMemory("tensorflow.get_memory_info.peak",
                      int(tf.config.experimental.get_memory_info("GPU:0")["peak"]))


def attention(device: str, causal_gqa: bool = False) -> str:
    """What ``keras.ops.dot_product_attention`` runs here (Keras 3.x): JAX's
    ``jax.nn.dot_product_attention`` (cuDNN flash where Keras finds the inputs eligible on a
    GPU, XLA's composite otherwise), torch's ``scaled_dot_product_attention``, or TF's einsum
    composite. ``causal_gqa`` (a Llama): causal, with fewer KV heads, which JAX groups natively
    and Keras' torch and TensorFlow backends repeat to the query heads first. The
    ``fxtrack.attention`` tag."""
    name, gpu = backend_name(), "gpu" in device
    impl = {"jax": "jax.nn.dot_product_attention:" + ("cudnn-if-eligible" if gpu else "xla"),
            "torch": "torch.sdpa" + (":flash-if-eligible" if gpu else ""),
            "tensorflow": "composite"}[name]
    if causal_gqa:
        impl += ":causal:" + ("gqa-native" if name == "jax" else "gqa-kv-repeated")
    return f"keras.ops.dot_product_attention:{impl}"


def tags(device: str) -> dict[str, str]:
    gpus = gpu_names() if "gpu" in device else []
    return {"device": gpus[0] if gpus else "cpu", "keras_backend": backend_name(),
            "keras_version": keras.__version__, "keras_backend_version": backend_version()}


def visible() -> list[str]:
    """Every device the backend can use here, e.g. ``["cpu", "gpu:0 NVIDIA H200"]``."""
    return ["cpu"] + [f"gpu:{i} {name}" for i, name in enumerate(gpu_names())]


DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def matmul_form(precision: str) -> tuple[Optional[Callable], str]:
    """The product fxtrack's Keras models compute their dense layers with at ``precision`` (None:
    Keras' own ``ops.matmul``), and why (the ``fxtrack.matmul_form`` tag). On the JAX backend at
    bf16 on a CPU: JAX's bf16-kernel form (``fxtrack.frameworks.xla_bf16``), as framework=jax's
    models; Keras' ``Dense`` asks XLA:CPU for a bf16-result dot there, which it upcasts to
    float32 (a fifth of the rate). Elsewhere Keras' own."""
    name = backend_name()
    if name != "jax":
        return None, f"Keras' own matmuls (keras on {name})"
    import jax

    from fxtrack.frameworks import xla_bf16

    fast, why = xla_bf16.fast_path(DTYPES[precision], jax.default_backend())
    return (xla_bf16.matmul if fast else None), why


def conv_form() -> tuple[Optional[Callable], str]:
    """The product fxtrack's Keras ResNet computes its 1x1 convolutions with (None: Keras' own
    convolutions), and why (the ``fxtrack.conv_form`` tag). On the JAX backend on a CPU: as
    framework=jax's (``xla_bf16.pointwise_conv``: XLA:CPU's convolution runs a 1x1 kernel at a
    fraction of its dot rate). Elsewhere Keras' own."""
    name = backend_name()
    if name != "jax":
        return None, f"Keras' own convolutions (keras on {name})"
    import jax

    from fxtrack.frameworks import xla_bf16

    fast, why = xla_bf16.conv_form(jax.default_backend())
    return (xla_bf16.pointwise_conv if fast else None), why


def matmul_tflops(backend: Any) -> float:
    """The calibration capability: the rate of an n x n @ n x n ``keras.ops.matmul`` at the
    spec's precision (the product ``matmul_form`` gives the models, where it gives one), n sized
    to the device by ``fxtrack.measure.matmul_probe``, synced by fetching one element (a
    device-to-host copy waits for the queued matmuls under every backend)."""
    dtype = DTYPES[backend.spec.precision]  # on the default device, as the model (backend.py)
    product = keras.ops.matmul
    if matmul_form(backend.spec.precision)[0] is not None:
        from fxtrack.frameworks import xla_bf16

        product = xla_bf16.PROBE_PRODUCT

    def make(n: int):
        a = keras.random.normal((n, n), dtype=dtype, seed=0)
        b = keras.random.normal((n, n), dtype=dtype, seed=1)

        def run(reps: int) -> None:
            for _ in range(reps):
                c = product(a, b)
            keras.ops.convert_to_numpy(c[0, 0])
        return run

    return matmul_probe.probe(make).tflops
