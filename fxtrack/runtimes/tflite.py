"""LiteRT (TensorFlow Lite): serves a ``.tflite`` flatbuffer through ``ai-edge-litert``'s
interpreter (XNNPACK delegate on a CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from fxtrack.runtimes import missing

try:
    from ai_edge_litert import interpreter as litert
except ImportError as e:  # pragma: no cover - depends on the install
    raise missing("tflite", "ai-edge-litert") from e


def version() -> str:
    from importlib.metadata import version as dist_version

    return dist_version("ai-edge-litert")


def load(path: Path, device_kind: str, threads: Optional[int] = None,
         every_output: bool = False) -> Callable[[Any], Any]:
    """An interpreter on ``path``; LiteRT runs on the CPU whatever ``device_kind`` says (its GPU
    delegate is for mobile GPUs), so a GPU host still serves it from the CPU. ``every_output``:
    through the flatbuffer's serving signature, fed by its input names, every output in the
    order of their names (Keras' export names them output_0, output_1, ...)."""
    interp = litert.Interpreter(model_path=str(path), num_threads=threads)
    if every_output:
        runner = interp.get_signature_runner()

        def run_all(x: dict[str, np.ndarray]) -> list[np.ndarray]:
            answer = runner(**x)
            return [answer[k] for k in sorted(answer, key=_natural)]

        return run_all
    interp.allocate_tensors()
    inp = interp.get_input_details()[0]["index"]
    out = interp.get_output_details()[0]["index"]

    def run(x: np.ndarray) -> np.ndarray:
        interp.set_tensor(inp, x)
        interp.invoke()
        return interp.get_tensor(out)

    return run


def _natural(name: str) -> tuple:
    """output_2 before output_10."""
    head = name.rstrip("0123456789")
    return head, int(name[len(head):] or -1)
