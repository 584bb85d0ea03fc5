"""Inference runtimes that serve an exported artefact (an ONNX file, a TFLite flatbuffer).

One module per runtime, each importing only its runtime, each with the same small interface::

    load(path, device_kind, threads) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]

``path`` is the artefact the framework's ``deployment`` module wrote; the callable maps one input
batch (the graph's input names to host NumPy arrays of the exported shapes: ``{"input": x}`` for
fxtrack's own models, a user's model may take several) to the list of every output in the
graph's order, synchronously.
The frameworks only export; what serves the file lives here, in its own layer
(docs/deployment-and-levers.md).
"""

from __future__ import annotations

from pathlib import Path

DEPLOY_EXTRA = "pip install 'fxtrack[deploy]'"
# runtime -> (the module it imports, the package that installs it): asked before any work
PACKAGES = {"onnxruntime": ("onnxruntime", "onnxruntime"),
            "tflite": ("ai_edge_litert", "ai-edge-litert"),
            "openvino": ("openvino", "openvino"),
            "tensorrt": ("onnxruntime", "onnxruntime-gpu")}


def unavailable(runtime: str) -> str | None:
    """Why ``runtime`` cannot serve from this interpreter (its package is not installed), or
    None; the runtime's own import says the same in the worker."""
    import importlib.util

    module, package = PACKAGES.get(runtime, (None, None))
    if module is None or importlib.util.find_spec(module) is not None:
        return None
    return f"runtime={runtime} needs the '{package}' package: {DEPLOY_EXTRA}"


def missing(runtime: str, package: str) -> ImportError:
    """The error for a runtime whose package is not installed in the worker's interpreter."""
    return ImportError(f"runtime={runtime} needs the '{package}' package: {DEPLOY_EXTRA}")


def onnx_external_files(path: Path) -> list[Path]:
    """The external data files an ONNX model's weights live in, beside the graph (jax2onnx
    keeps BERT's in model.onnx.data); empty when every weight is inside the file."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    model = onnx.load(str(path), load_external_data=False)
    return sorted({path.parent / entry.value for t in model.graph.initializer
                   if uses_external_data(t) for entry in t.external_data if entry.key == "location"})
