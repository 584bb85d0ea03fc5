"""Deployment exports for TensorFlow/Keras (capabilities ``onnx_export`` and ``tflite_export``;
the serving export is ``serving.py``'s), for fxtrack's own models and a user's alike: the Keras
model in inference mode at the first replica's resident inputs' shapes, called with the
structure it was built with (one array, a list or a dict), its floating outputs flattened in
``tf.nest`` order. TFLite (LiteRT) through ``tf.lite.TFLiteConverter`` (fp32, or dynamic-range
int8 weights with ``Optimize.DEFAULT``) and ONNX through ``tf2onnx``. The exported graph's
inputs are named as ``user_builder.named_inputs`` names them (``input`` for one array); its
outputs ``output_0``, ``output_1``, ... are the floating outputs ``reference`` gives for the
native model."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import keras
import numpy as np
import tensorflow as tf

from fxtrack.frameworks import user_builder as ub
from fxtrack.frameworks.declaration import NotSupported


def _inputs(backend: Any) -> Any:
    """The model's inputs in the first replica's resident batch: fxtrack's own batch's images
    or token ids, or the inputs of a builder's (inputs, targets) pair (model=custom)."""
    batch = backend.replica_batch()
    if isinstance(batch, tuple):
        return batch[0]
    return batch["images"] if "images" in batch else batch["input_ids"]


def _forward(backend: Any, named: dict[str, Any]) -> list[tf.Tensor]:
    """The model on inputs by name, rebuilt into its own structure; its floating outputs."""
    inputs = _inputs(backend)
    values = list(named.values()) if not isinstance(inputs, dict) else None
    structured = (dict(named) if isinstance(inputs, dict) else
                  list(values) if isinstance(inputs, (tuple, list)) else values[0])
    outputs = tf.nest.flatten(backend.model(structured, training=False))
    return [o for o in outputs if o.dtype.is_floating]


def _specs(backend: Any) -> dict[str, tf.TensorSpec]:
    return {k: tf.TensorSpec(v.shape, v.dtype, name=k)
            for k, v in ub.named_inputs(_inputs(backend)).items()}


def reference(backend: Any) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """(named inputs, floating outputs as float32) of the native model in inference mode."""
    named = ub.named_inputs(_inputs(backend))
    with tf.device(backend.device):
        outs = _forward(backend, named)
    return ({k: v.numpy() for k, v in named.items()},
            [tf.cast(o, tf.float32).numpy() for o in outs])


def _refusal(backend: Any, exporter: str, e: Exception) -> NotSupported:
    return ub.exporter_refusal(f"runtime={backend.spec.runtime}", exporter, backend.arch,
                               backend.framework, e)


def to_tflite(backend: Any, path: Path, quantize: bool = False) -> Path:
    """A SavedModel of one endpoint (Keras' ``ExportArchive``, as ``model.export`` writes it:
    the model's variables tracked; converting a concrete function of the live Keras 3 model
    directly leaves them out, all-NaN outputs) taking the inputs by name and giving
    ``output_<i>``, then the TFLite converter (``quantize``: dynamic-range int8 weights,
    activations quantised on the fly by the int8 kernels)."""
    saved = path.with_suffix(".savedmodel")
    archive = keras.export.ExportArchive()
    archive.track(backend.model)
    archive.add_endpoint(
        "serve", lambda named: {f"output_{i}": o for i, o in enumerate(_forward(backend, named))},
        input_signature=[_specs(backend)])
    try:
        archive.write_out(str(saved), verbose=False)
        converter = tf.lite.TFLiteConverter.from_saved_model(str(saved))
        if quantize:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        path.write_bytes(converter.convert())
        return path
    except NotSupported:
        raise
    except Exception as e:  # noqa: BLE001  (any exporter failure is the cell's reason)
        raise _refusal(backend, f"tensorflow {tf.__version__}'s TFLite converter", e) from None


def to_onnx(backend: Any, path: Path, tags: Optional[dict[str, str]] = None) -> Path:
    """The inference-mode forward through tf2onnx (opset 17), its inputs by name, its floating
    outputs in order, checked."""
    try:
        import tf2onnx
    except ImportError as e:
        raise ImportError("runtime=onnxruntime/openvino for tensorflow needs tf2onnx: "
                          "pip install 'fxtrack[deploy]'") from e
    specs = _specs(backend)
    fn = tf.function(lambda *xs: _forward(backend, dict(zip(specs, xs))))
    try:
        tf2onnx.convert.from_function(fn, input_signature=tuple(specs.values()), opset=17,
                                      output_path=str(path))
    except Exception as e:  # noqa: BLE001  (any exporter failure is the cell's reason)
        raise _refusal(backend, "tf2onnx", e) from None
    import onnx

    try:  # tf2onnx writes ops it could not convert as they were: a graph no runtime can load
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as e:
        raise NotSupported(f"runtime=onnxruntime is not supported by tf2onnx "
                           f"{tf2onnx.__version__} for this model: "
                           f"{str(e).splitlines()[0][:160]}") from None
    if tags is not None:
        tags["onnx_exporter"] = "tf2onnx"
    return path
