"""Deployment exports for TensorFlow/Keras (capabilities ``onnx_export`` and ``tflite_export``;
the serving export is ``serving.py``'s): TFLite (LiteRT) through ``tf.lite.TFLiteConverter``
(fp32, or dynamic-range int8 weights with ``Optimize.DEFAULT``) and ONNX through ``tf2onnx``;
both of the model in inference mode at the resident batch's shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from fxtrack.frameworks.declaration import NotSupported


def _input(backend) -> tf.Tensor:
    batch = backend.replica_batch()  # the first replica's resident batch
    return batch["images"] if "images" in batch else batch["input_ids"]


def reference(backend) -> tuple[np.ndarray, np.ndarray]:
    """(input, output) of the native Keras model in inference mode on the resident batch: NHWC
    images or (B, T) ids; (B, classes) or (B, T, vocab) logits as float32."""
    x = _input(backend)
    with tf.device(backend.device):
        y = backend.model(x, training=False)
    return x.numpy(), tf.cast(y, tf.float32).numpy()


def to_tflite(backend, path: Path, quantize: bool = False) -> Path:
    """The model as a TFLite flatbuffer; ``quantize``: dynamic-range int8 (weights int8,
    activations quantised on the fly by the int8 kernels)."""
    # Through a SavedModel (Keras' own export, fixed batch shape): converting a concrete function
    # of the live Keras 3 model directly leaves its variables out (all-NaN outputs).
    saved = path.with_suffix(".savedmodel")
    x = _input(backend)
    spec = tf.TensorSpec(x.shape, x.dtype, name="input")
    backend.model.export(str(saved), format="tf_saved_model", input_signature=[spec], verbose=False)
    return convert_tflite(saved, path, quantize)


def convert_tflite(saved: Path, path: Path, quantize: bool) -> Path:
    """The SavedModel at ``saved`` through the TFLite converter into ``path`` (shared with
    model=custom's ``user_deployment``)."""
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved))
    if quantize:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    path.write_bytes(converter.convert())
    return path


def to_onnx(backend, path: Path) -> Path:
    """The model as ONNX through tf2onnx (opset 17), from the same inference-mode function."""
    x = _input(backend)
    spec = (tf.TensorSpec(x.shape, x.dtype, name="input"),)
    fn = tf.function(lambda x: backend.model(x, training=False))
    return onnx_from_function(fn, spec, path)


def onnx_from_function(fn, spec: tuple, path: Path) -> Path:
    """``fn`` (a ``tf.function``) at ``spec`` through tf2onnx (opset 17) into ``path``, checked
    (shared with model=custom's ``user_deployment``)."""
    try:
        import tf2onnx
    except ImportError as e:
        raise ImportError("runtime=onnxruntime/openvino for tensorflow needs tf2onnx: "
                          "pip install 'fxtrack[deploy]'") from e
    tf2onnx.convert.from_function(fn, input_signature=spec, opset=17, output_path=str(path))
    import onnx

    try:  # tf2onnx writes ops it could not convert as they were: a graph no runtime can load
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as e:
        raise NotSupported(f"runtime=onnxruntime is not supported by tf2onnx "
                           f"{tf2onnx.__version__} for this model: "
                           f"{str(e).splitlines()[0][:160]}") from None
    return path
