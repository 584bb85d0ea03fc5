"""ONNX Runtime: serves an ONNX file (CPU, or CUDA where the GPU build is installed), and its
dynamic int8 quantiser."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import numpy as np

from fxtrack.runtimes import missing, onnx_external_files

try:
    import onnxruntime as ort
except ImportError as e:  # pragma: no cover - depends on the install
    raise missing("onnxruntime", "onnxruntime") from e


def version() -> str:
    return ort.__version__


def load(path: Path, device_kind: str, threads: Optional[int] = None,
         providers: Optional[list] = None) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    """A session on ``path`` with every graph optimisation on; ``threads`` intra-op threads
    (None: ONNX Runtime's default, one per physical core); fed a dict of input names, it
    returns every output (fxtrack.runtimes)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3  # errors only: exporters leave unused initialisers it warns about
    if threads:
        opts.intra_op_num_threads = threads
    if providers is None:
        providers = ["CPUExecutionProvider"]
        if device_kind == "gpu":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise RuntimeError("runtime=onnxruntime on a GPU needs the onnxruntime-gpu build "
                                   f"(this one offers {ort.get_available_providers()})")
            providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    session = ort.InferenceSession(str(path), opts, providers=providers)

    def run(x: dict[str, np.ndarray]) -> list[np.ndarray]:
        return session.run(None, x)

    return run



def quantize_dynamic(src: Path, dst: Path) -> Path:
    """Dynamic int8: MatMul/Gemm weights stored as int8, activations quantised per batch at
    run time (the same layers ``torch.ao``'s ``quantize_dynamic`` takes: the Linear ones)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = dst.with_suffix(".pre.onnx")
    inline = _inlined(src, dst.with_suffix(".inline.onnx"))
    quant_pre_process(str(inline), str(pre), skip_symbolic_shape=True)  # fold shapes, as ORT advises
    quantize_dynamic(str(pre), str(dst), weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul", "Gemm"])
    pre.unlink()
    if inline != src:
        inline.unlink()
    return dst


def _inlined(src: Path, dst: Path) -> Path:
    """``src``, or a copy of it at ``dst`` with its weights inside the one file when the
    exporter kept them in an external data file (jax2onnx does for BERT): the quantiser's
    pre-processing re-saves the model in a temporary directory without that file and fails
    ("should be stored in .../model.onnx.data, but it is not regular file")."""
    import onnx

    if not onnx_external_files(src):
        return src
    model = onnx.load(str(src))  # the weights loaded from their files, now inline
    if model.ByteSize() >= 2**31:  # protobuf's limit for one file
        from fxtrack.frameworks.declaration import NotSupported

        raise NotSupported(f"quantize=dynamic_int8 of {src.name} is not supported by onnxruntime: "
                           "the model is over 2 GiB, beyond what its quantiser can re-save in "
                           "one file")
    onnx.save(model, str(dst))
    return dst
