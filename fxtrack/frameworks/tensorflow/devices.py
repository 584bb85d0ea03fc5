"""Device choice, memory counters and device tags for TensorFlow."""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from fxtrack.frameworks.base import PeakMemory
from fxtrack.measure import matmul_probe

# tf32 computes in float32 like fp32; only the matmul precision differs (see ``configure``).
DTYPES = {"fp32": tf.float32, "tf32": tf.float32, "bf16": tf.bfloat16, "fp16": tf.float16}


def configure(precision: str, threads: int) -> dict[str, str]:
    """The fairness policy (fxtrack.policy), applied before TensorFlow initialises its runtime;
    returns the settings read back from TensorFlow, as run tags.

    Matmuls: TF32 only with ``precision=tf32`` (TensorFlow's own default allows TF32 on Ampere and
    later GPUs; fp32 means strict IEEE fp32 in every framework). Threads: intra- and inter-op
    pools sized to ``threads``; they can be set only before the runtime starts, so a second call
    in one process (tests) keeps the first sizes and reads those back."""
    tf.config.experimental.enable_tensor_float_32_execution(precision == "tf32")
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:  # runtime already initialised
        pass
    tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
    return {"matmul_precision": "tf32" if tf32 else "fp32",
            # 0 would mean "TensorFlow's default" (every core); the env / setter above sized it.
            "cpu_threads": str(tf.config.threading.get_intra_op_parallelism_threads()),
            "cpu_interop_threads": str(tf.config.threading.get_inter_op_parallelism_threads())}


def select(hardware: str) -> str:
    """``auto`` | ``cpu`` | ``gpu`` -> a TF device name (``"/GPU:0"`` or ``"/CPU:0"``), with
    memory growth on, so that the peak counter (and NVML) see the model, not a reserved pool."""
    gpus = tf.config.list_physical_devices("GPU")
    if hardware == "gpu" and not gpus:
        raise RuntimeError("hardware=gpu, but TensorFlow sees no GPU "
                           f"(tensorflow {tf.__version__}, "
                           f"built with CUDA: {tf.test.is_built_with_cuda()})")
    if hardware in ("gpu", "auto") and gpus:
        for gpu in gpus:
            try:
                tf.config.experimental.set_memory_growth(gpu, True)
            except RuntimeError:  # runtime already initialised: TF_FORCE_GPU_ALLOW_GROWTH applies
                pass
        return "/GPU:0"
    return "/CPU:0"


def sync(device: str) -> None:
    """Wait for the device's queued work (eager CPU ops already ran when they returned)."""
    if "GPU" in device:
        tf.test.experimental.sync_devices()  # note: the CPU waits for every queued kernel


def peak_memory(device: str) -> Optional[PeakMemory]:
    """TF allocator's peak bytes on a GPU (``get_memory_info()["peak"]``; it reports no pool
    peak); None on CPU (no such counter)."""
    if "GPU" not in device:
        return None
    info = tf.config.experimental.get_memory_info(device.lstrip("/"))
    return PeakMemory("tensorflow.get_memory_info.peak", int(info["peak"]))


def visible() -> list[str]:
    """Every device TensorFlow can use here, e.g. ``["cpu", "gpu:0 NVIDIA H200"]``."""
    gpus = tf.config.list_physical_devices("GPU")
    names = [tf.config.experimental.get_device_details(g).get("device_name", "gpu") for g in gpus]
    return ["cpu"] + [f"gpu:{i} {name}" for i, name in enumerate(names)]


def tags(device: str) -> dict[str, str]:
    """Device name and the CUDA / cuDNN versions TensorFlow was built with."""
    if "GPU" not in device:
        return {"device": "cpu"}
    details = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
    build = tf.sysconfig.get_build_info()
    return {"device": str(details.get("device_name", "gpu")),
            "cuda": str(build.get("cuda_version", "")),
            "cudnn": str(build.get("cudnn_version", ""))}


def matmul_tflops(backend) -> float:
    """Capability ``calibration``: the rate of an n x n @ n x n matmul at the spec's precision on
    the backend's device, n sized to the device by ``fxtrack.measure.matmul_probe``."""
    device, dtype = backend.device, DTYPES[backend.spec.precision]

    def make(n: int):
        with tf.device(device):
            a = tf.random.normal((n, n), dtype=dtype)
            b = tf.random.normal((n, n), dtype=dtype)

        def run(reps: int) -> None:
            with tf.device(device):
                for _ in range(reps):
                    tf.matmul(a, b)
            sync(device)
        return run

    return matmul_probe.probe(make).tflops
