"""LiteRT (TensorFlow Lite): serves a ``.tflite`` flatbuffer through ``ai-edge-litert``'s
interpreter (XNNPACK delegate on a CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import numpy as np

from fxtrack.runtimes import missing

try:
    from ai_edge_litert import interpreter as litert
except ImportError as e:  # pragma: no cover - depends on the install
    raise missing("tflite", "ai-edge-litert") from e


def version() -> str:
    from importlib.metadata import version as dist_version

    return dist_version("ai-edge-litert")


def load(path: Path, device_kind: str, threads: Optional[int] = None
         ) -> Callable[[np.ndarray], np.ndarray]:
    """An interpreter on ``path``; LiteRT runs on the CPU whatever ``device_kind`` says (its GPU
    delegate is for mobile GPUs), so a GPU host still serves it from the CPU."""
    interp = litert.Interpreter(model_path=str(path), num_threads=threads)
    interp.allocate_tensors()
    inp = interp.get_input_details()[0]["index"]
    out = interp.get_output_details()[0]["index"]

    def run(x: np.ndarray) -> np.ndarray:
        interp.set_tensor(inp, x)
        interp.invoke()
        return interp.get_tensor(out)

    return run
