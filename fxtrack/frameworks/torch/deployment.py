"""Deployment exports for PyTorch (capabilities ``onnx_export`` and ``native_int8``; the
serving export is ``serving.py``'s), for fxtrack's own models and a user's alike: the model in
eval mode, called as it is called (one tensor, positional or keyword inputs), its floating
outputs flattened (a Hugging Face ``ModelOutput`` read as its dict). ONNX through the dynamo
exporter (``torch.onnx.export(..., dynamo=True)``, needs ``onnx`` and ``onnxscript``), and dynamic
int8 quantisation of the Linear layers in PyTorch itself
(``torch.ao.quantization.quantize_dynamic``). The exported graph's inputs are named as
``user_builder.named_inputs`` names them (``input`` for one tensor); its outputs are the
flattened floating outputs, in order, which ``reference`` gives for the native model."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from fxtrack.frameworks import user_builder as ub
from fxtrack.frameworks.declaration import NotSupported
from fxtrack.frameworks.torch import INT8_CPU_ONLY
from fxtrack.frameworks.torch.train import model_input
from fxtrack.frameworks.torch.user_model import plain


class Flat(nn.Module):
    """The model on positional tensors (``named_inputs``' order), called with the structure it
    was built with, returning its floating outputs as a flat tuple: what an ONNX graph's inputs
    and outputs are."""

    def __init__(self, model: nn.Module, inputs: Any) -> None:
        super().__init__()
        self.model = model
        self.names = list(ub.named_inputs(inputs))
        self.structure = "dict" if isinstance(inputs, dict) else (
            "tuple" if isinstance(inputs, (tuple, list)) else "one")

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inputs = (dict(zip(self.names, xs)) if self.structure == "dict"
                  else xs if self.structure == "tuple" else xs[0])
        out = ub.apply(self.model, inputs)
        return tuple(t for t in ub.leaves(plain(out))
                     if isinstance(t, torch.Tensor) and t.is_floating_point())


def _flat(backend: Any) -> tuple[Flat, dict[str, torch.Tensor]]:
    backend.model.eval()  # BatchNorm running statistics, no Dropout: as served
    inputs = model_input(backend.batch)
    return Flat(backend.model, inputs), {k: v.contiguous()
                                         for k, v in ub.named_inputs(inputs).items()}


def reference(backend: Any) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """(named inputs, floating outputs as float32) of the native fp32 model in eval mode on the
    resident batch: what every runtime's output is checked against."""
    flat, xs = _flat(backend)
    with torch.inference_mode():
        outs = flat(*xs.values())
    return ({k: np.ascontiguousarray(v.cpu().numpy()) for k, v in xs.items()},
            [o.float().cpu().numpy() for o in outs])


def to_onnx(backend: Any, path: Path) -> Path:
    """The model as ONNX through torch's dynamo exporter at the resident inputs' shapes (opset
    chosen by the exporter); an exporter that cannot convert it is NotSupported with its own
    error."""
    flat, xs = _flat(backend)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's deprecation chatter
            program = torch.onnx.export(flat, tuple(xs.values()), dynamo=True,
                                        input_names=list(xs), verbose=False)
        program.save(str(path))
        return path
    except NotSupported:
        raise
    except Exception as e:  # noqa: BLE001  (any exporter failure is the cell's reason)
        raise ub.exporter_refusal(f"runtime={backend.spec.runtime}",
                                  f"torch {torch.__version__}'s ONNX exporter", backend.arch,
                                  backend.framework, e) from None


def quantize_native(backend: Any) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    """Dynamic int8 in PyTorch: the model's ``nn.Linear`` weights int8, activations quantised
    per batch at run time (fbgemm / qnnpack CPU kernels only: a GPU run fails clearly); layers
    of other types (a Hugging Face GPT-2's ``Conv1D``) stay fp32. A copy: the fp32 model stays
    the reference."""
    if backend.device.type != "cpu":
        raise NotSupported("quantize=dynamic_int8 with runtime=native on a GPU is not supported "
                           f"by torch {torch.__version__}: {INT8_CPU_ONLY}")
    import copy

    from torch.ao.quantization import quantize_dynamic

    flat, _ = _flat(backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's migration notice (to torchao)
        quantized = quantize_dynamic(copy.deepcopy(flat), {nn.Linear}, dtype=torch.qint8)

    def run(x: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            outs = quantized(*(torch.from_numpy(v) for v in x.values()))
        return [o.float().numpy() for o in outs]

    return run
