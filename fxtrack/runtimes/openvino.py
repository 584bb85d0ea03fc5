"""OpenVINO: reads the ONNX file directly and compiles it for the CPU (or an Intel GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import numpy as np

from fxtrack.runtimes import missing

try:
    import openvino as ov
except ImportError as e:  # pragma: no cover - depends on the install
    raise missing("openvino", "openvino") from e


def version() -> str:
    return ov.get_version()


def load(path: Path, device_kind: str, threads: Optional[int] = None
         ) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    """The model compiled for OpenVINO's CPU plugin, latency hint (one batch at a time, as
    every fxtrack runtime is timed). OpenVINO's GPU plugin is for Intel GPUs: on an NVIDIA
    host the model still runs on the CPU."""
    core = ov.Core()
    # f32 inference precision: on CPUs with bf16 units the plugin's default is bf16, which is
    # a precision change (about 1e-2 relative on ResNet-50), not a runtime's speed-up.
    config: dict = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
    request = compiled.create_infer_request()

    def run(x: dict[str, np.ndarray]) -> list[np.ndarray]:  # fed by the inputs' names
        answer = request.infer(x)
        return [answer[out] for out in compiled.outputs]

    return run
