"""Deployment exports for PyTorch (capabilities ``onnx_export`` and ``native_int8``; the
serving export is ``serving.py``'s), for fxtrack's own models and a user's alike: the model in
eval mode, called as it is called (one tensor, positional or keyword inputs), its floating
outputs flattened (a Hugging Face ``ModelOutput`` read as its dict). ONNX through the dynamo
exporter (``torch.onnx.export(..., dynamo=True)``, needs ``onnx`` and ``onnxscript``), or where it
refuses the model the TorchScript exporter (``dynamo=False``), and dynamic int8 quantisation of the Linear layers in PyTorch itself
(``torch.ao.quantization.quantize_dynamic``). The exported graph's inputs are named as
``user_builder.named_inputs`` names them (``input`` for one tensor); its outputs are the
flattened floating outputs, in order, which ``reference`` gives for the native model."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import nn

from fxtrack.frameworks import user_builder as ub
from fxtrack.frameworks.declaration import NotSupported
from fxtrack.frameworks.torch import INT8_CPU_ONLY
from fxtrack.frameworks.torch.train import model_input
from fxtrack.frameworks.torch.user_model import plain
from fxtrack.measure.timer import eprint


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


def _dynamo(flat: Flat, xs: dict[str, torch.Tensor], path: Path) -> None:
    program = torch.onnx.export(flat, tuple(xs.values()), dynamo=True, input_names=list(xs),
                                verbose=False)
    program.save(str(path))


def _torchscript(flat: Flat, xs: dict[str, torch.Tensor], path: Path) -> None:
    torch.onnx.export(flat, tuple(xs.values()), str(path), dynamo=False, input_names=list(xs))


# Tried in order, the first that writes the graph wins: dynamo's torch.export capture refuses
# some models the TorchScript tracer takes (a Hugging Face T5: a view of a transposed tensor).
EXPORTERS: tuple[tuple[str, Callable[[Flat, dict[str, torch.Tensor], Path], None]], ...] = (
    ("dynamo", _dynamo), ("torchscript", _torchscript))


def to_onnx(backend: Any, path: Path, tags: Optional[dict[str, str]] = None) -> Path:
    """The model as ONNX at the resident inputs' shapes (opset chosen by the exporter): torch's
    dynamo exporter, then where it refuses, the TorchScript one; ``tags`` gets ``onnx_exporter``
    (which wrote it) and, after a refusal, ``onnx_dynamo_refusal``. Both refusing is
    NotSupported quoting both; a package either lacks is an ImportError naming it."""
    flat, xs = _flat(backend)
    refused: dict[str, BaseException] = {}
    for name, export in EXPORTERS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the exporters' deprecation and tracer chatter
                export(flat, xs, path)
        except NotSupported:
            raise
        except Exception as e:  # noqa: BLE001  (any failure: the next path, or a reason)
            refused[name] = e
            continue
        if tags is not None:
            tags["onnx_exporter"] = name
            if "dynamo" in refused:
                tags["onnx_dynamo_refusal"] = ub.root_reason(refused["dynamo"])
        if refused:
            eprint(f"[fxtrack] ONNX: the {name} exporter wrote the graph after "
                   + "; ".join(f"{k} refused ({ub.root_reason(e)})" for k, e in refused.items()))
        return path
    runtime = f"runtime={backend.spec.runtime}"
    lacking = [(k, ub.root_cause(e)) for k, e in refused.items()
               if isinstance(ub.root_cause(e), ImportError)]
    if lacking:  # an install away, not a model the exporters cannot take
        k, e = lacking[0]
        package = f"the '{e.name.split('.')[0]}' package" if e.name else ub.root_reason(e)
        others = "".join(f"; the {o} exporter: {ub.root_reason(r)}" for o, r in refused.items()
                         if o != k)
        raise ImportError(f"{runtime} for torch needs {package} (the {k} exporter imports "
                          f"it): pip install 'fxtrack[deploy]'{others}")
    raise ub.exporter_refusal(runtime, f"torch {torch.__version__}'s ONNX exporter", backend.arch,
                              backend.framework, refused)


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
