"""Deployment exports for PyTorch (capabilities ``onnx_export`` and ``native_int8``; the
serving export is ``serving.py``'s): ONNX through the dynamo exporter (``torch.onnx.export(...,
dynamo=True)``, needs ``onnx`` and ``onnxscript``), and dynamic int8 quantisation of the Linear
layers in PyTorch itself (``torch.ao.quantization.quantize_dynamic``)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
from torch import nn

from fxtrack.frameworks.declaration import NotSupported
from fxtrack.frameworks.torch import INT8_CPU_ONLY
from fxtrack.frameworks.torch.train import model_input


def _eval_model(backend) -> nn.Module:
    model = backend.model
    model.eval()  # BatchNorm running statistics, as served
    return model


def reference(backend) -> tuple[np.ndarray, np.ndarray]:
    """(input, output) of the native fp32 model in inference mode on the resident batch:
    what every runtime's output is checked against. Input is C-contiguous (NCHW images or
    (B, T) ids); output (B, classes) or (B, T, vocab) logits."""
    model, x = _eval_model(backend), model_input(backend.batch)
    with torch.inference_mode():
        y = model(x)
    return np.ascontiguousarray(x.cpu().numpy()), y.float().cpu().numpy()


def to_onnx(backend, path: Path) -> Path:
    """The model as an ONNX graph for the resident batch's shape (opset chosen by the exporter)."""
    model, x = _eval_model(backend), model_input(backend.batch).contiguous()
    return export_onnx(model, (x,), ["input"], ["logits"], path)


def export_onnx(model: nn.Module, args: tuple, input_names: list[str],
                output_names: Optional[list[str]], path: Path) -> Path:
    """``model(*args)`` through the dynamo exporter, saved at ``path`` (shared with model=custom's
    ``user_deployment``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation chatter
        program = torch.onnx.export(model, args, dynamo=True, input_names=input_names,
                                    output_names=output_names, verbose=False)
    program.save(str(path))
    return path


def quantize_native(backend) -> Callable[[np.ndarray], np.ndarray]:
    """Dynamic int8 in PyTorch: Linear weights int8, activations quantised per batch at run time
    (fbgemm / qnnpack CPU kernels only: a GPU run fails clearly). The model is copied, so the
    fp32 one stays the reference."""
    quantized = quantize_linear(backend, _eval_model(backend))

    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return quantized(torch.from_numpy(x)).float().numpy()

    return run


def quantize_linear(backend, model: nn.Module) -> nn.Module:
    """A copy of ``model`` with its Linear layers dynamic int8 (``quantize_dynamic``), on a CPU
    only (shared with model=custom's ``user_deployment``)."""
    if backend.device.type != "cpu":
        raise NotSupported("quantize=dynamic_int8 with runtime=native on a GPU is not supported "
                           f"by torch {torch.__version__}: {INT8_CPU_ONLY}")
    import copy

    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's migration notice (to torchao)
        return quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
