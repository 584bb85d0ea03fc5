"""Deployment export for JAX (capability ``onnx_export``; the serving export is
``serving.py``'s): ONNX through ``jax2onnx`` (the maintained JAX/Flax-to-ONNX
exporter), tracing the inference-mode forward with the weights baked in as constants: one
input named ``input``, one output."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Optional

import jax
import numpy as np

from fxtrack.frameworks.declaration import NotSupported
from fxtrack.frameworks.jax import train


def _forward(backend):
    """The inference-mode forward (BatchNorm running statistics) as a function of the input only:
    the live weights are closed over, so an exporter sees them as constants."""
    graphdef = train.eval_graphdef(backend.graphdef, backend.state)
    params, stats = backend.state.params, backend.state.batch_stats
    return functools.partial(train.forward, graphdef, params, stats)


def _input(backend) -> np.ndarray:
    return np.asarray(train.model_inputs(backend.batch))  # NHWC images or (B, T) ids


def reference(backend) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """(the input by its exported name, [the output]) of the jitted fp32 forward on the
    resident batch, on the host. fxtrack's own models only: a user's model is refused before
    any work (the framework's Limit)."""
    x = _input(backend)
    y = jax.jit(_forward(backend))(x)
    return {"input": x}, [np.asarray(y, dtype=np.float32)]


def to_onnx(backend, path: Path, tags: Optional[dict[str, str]] = None) -> Path:
    """The model as ONNX for the resident batch's shape (jax2onnx's default opset)."""
    try:
        from jax2onnx import to_onnx as convert
    except ImportError as e:
        raise ImportError("runtime=onnxruntime/openvino for jax needs jax2onnx: "
                          "pip install 'fxtrack[deploy-jax]'") from e
    from importlib.metadata import version

    x = _input(backend)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            convert(_forward(backend), [jax.ShapeDtypeStruct(x.shape, x.dtype)],
                    model_name="fxtrack", return_mode="file", output_path=str(path),
                    input_names=["input"], output_names=["logits"])
    except (TypeError, NotImplementedError, ValueError) as e:
        # jax2onnx 0.17.1 replaces nnx.max_pool with a patch that rejects Flax's own
        # positional call (ResNet's stem): its failure, not the model's.
        raise NotSupported(f"runtime=onnxruntime is not supported by jax2onnx "
                           f"{version('jax2onnx')} for {backend.arch.name}: "
                           f"{type(e).__name__}: {str(e).splitlines()[0][:160]}") from None
    if tags is not None:
        tags["onnx_exporter"] = "jax2onnx"
    return path
