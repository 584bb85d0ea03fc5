"""TensorRT: builds an engine from the ONNX file on an NVIDIA GPU, through ONNX Runtime's
TensorRT execution provider (the engine build and cache are TensorRT's own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from fxtrack.runtimes import DEPLOY_EXTRA


def load(path: Path, device_kind: str, threads: Optional[int] = None
         ) -> Callable[[dict[str, Any]], list[Any]]:
    if device_kind != "gpu":
        raise RuntimeError("runtime=tensorrt needs an NVIDIA GPU (TensorRT has no CPU path); "
                           "on a CPU use runtime=onnxruntime or runtime=openvino")
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise ImportError(f"runtime=tensorrt runs through onnxruntime-gpu: {DEPLOY_EXTRA} "
                          "and pip install onnxruntime-gpu tensorrt") from e
    if "TensorrtExecutionProvider" not in ort.get_available_providers():
        raise RuntimeError("runtime=tensorrt: this onnxruntime offers no TensorrtExecutionProvider "
                           f"({ort.get_available_providers()}); pip install onnxruntime-gpu tensorrt")
    from fxtrack.runtimes import onnxruntime as ort_runtime

    cache = path.parent / "trt_cache"  # the engine is built on the first call (the warm-up)
    providers = [("TensorrtExecutionProvider", {"trt_engine_cache_enable": True,
                                                "trt_engine_cache_path": str(cache)}),
                 "CUDAExecutionProvider"]
    return ort_runtime.load(path, device_kind, threads, providers=providers)
