"""model=custom's deployment exports in TensorFlow (capabilities ``user_tflite_export`` and
``user_onnx_export``): the user's Keras model in inference mode at the resident inputs' shapes,
called with the structure it was built with (one array, a list or a dict), its floating outputs
flattened in ``tf.nest`` order, through the same converters as fxtrack's own models
(``deployment.convert_tflite``, ``deployment.onnx_from_function``). The exported graph's inputs
are named as ``user_builder.named_inputs`` names them; its outputs ``output_0``, ``output_1``, ...
are the floating outputs ``reference`` gives for the native model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from fxtrack.frameworks import user_builder as ub
from fxtrack.frameworks.declaration import NotSupported
from fxtrack.frameworks.tensorflow import deployment


def _named(backend: Any) -> dict[str, tf.Tensor]:
    return ub.named_inputs(backend.one_batch[0])  # the first replica's resident inputs


def _forward(backend: Any, named: dict[str, Any]) -> list[tf.Tensor]:
    """The model on inputs by name, rebuilt into its own structure; its floating outputs."""
    inputs = backend.one_batch[0]
    values = list(named.values()) if not isinstance(inputs, dict) else None
    structured = (dict(named) if isinstance(inputs, dict) else
                  list(values) if isinstance(inputs, (tuple, list)) else values[0])
    outputs = tf.nest.flatten(backend.model(structured, training=False))
    return [o for o in outputs if o.dtype.is_floating]


def _specs(backend: Any) -> dict[str, tf.TensorSpec]:
    return {k: tf.TensorSpec(v.shape, v.dtype, name=k) for k, v in _named(backend).items()}


def reference(backend: Any) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """(named inputs, floating outputs as float32) of the native model in inference mode."""
    named = _named(backend)
    with tf.device(backend.device):
        outs = _forward(backend, named)
    return ({k: v.numpy() for k, v in named.items()},
            [tf.cast(o, tf.float32).numpy() for o in outs])


def _refusal(backend: Any, exporter: str, e: Exception) -> NotSupported:
    return ub.exporter_refusal(f"runtime={backend.spec.runtime}", exporter, backend.arch,
                               backend.framework, e)


def to_tflite(backend: Any, path: Path, quantize: bool = False) -> Path:
    """A SavedModel of one endpoint (Keras' ``ExportArchive``, as ``model.export`` writes it:
    the model's variables tracked) taking the inputs by name and giving ``output_<i>``, then
    the TFLite converter (``quantize``: dynamic-range int8 weights)."""
    saved = path.with_suffix(".savedmodel")
    archive = keras.export.ExportArchive()
    archive.track(backend.model)
    archive.add_endpoint(
        "serve", lambda named: {f"output_{i}": o for i, o in enumerate(_forward(backend, named))},
        input_signature=[_specs(backend)])
    try:
        archive.write_out(str(saved), verbose=False)
        return deployment.convert_tflite(saved, path, quantize)
    except NotSupported:
        raise
    except Exception as e:  # noqa: BLE001  (any exporter failure is the cell's reason)
        raise _refusal(backend, f"tensorflow {tf.__version__}'s TFLite converter", e) from None


def to_onnx(backend: Any, path: Path) -> Path:
    """The inference-mode forward through tf2onnx, its inputs by name, its floating outputs in
    order."""
    specs = _specs(backend)
    fn = tf.function(lambda *xs: _forward(backend, dict(zip(specs, xs))))
    try:
        return deployment.onnx_from_function(fn, tuple(specs.values()), path)
    except NotSupported:
        raise
    except Exception as e:  # noqa: BLE001  (any exporter failure is the cell's reason)
        raise _refusal(backend, "tf2onnx", e) from None
