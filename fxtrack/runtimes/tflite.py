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
         ) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    """An interpreter on ``path``; LiteRT runs on the CPU whatever ``device_kind`` says (its GPU
    delegate is for mobile GPUs), so a GPU host still serves it from the CPU. Through the
    flatbuffer's serving signature, fed by its input names, every output in the order of their
    names (Keras' export names them output_0, output_1, ...)."""
    interp = litert.Interpreter(model_path=str(path), num_threads=threads)
    runner = interp.get_signature_runner()

    def run(x: dict[str, np.ndarray]) -> list[np.ndarray]:
        answer = runner(**x)
        return [answer[k] for k in sorted(answer, key=_natural)]

    return run


def _natural(name: str) -> tuple:
    """output_2 before output_10."""
    head = name.rstrip("0123456789")
    return head, int(name[len(head):] or -1)
