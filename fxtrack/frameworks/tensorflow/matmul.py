"""bf16 matmuls under XLA on a CPU in the one form XLA:CPU's bf16 kernels take.

As in JAX (frameworks/xla_bf16.py, which says why): XLA:CPU runs a bf16 x bf16 dot on its
bf16 kernels (AMX / AVX512-BF16) only when the dot asks for a float32 result and its left
operand contracts its last axis; Keras' bf16 ``ops.matmul`` and its weight gradient are upcast
to float32 instead, 3-5x slower (docs/measurements.md#bf16-matmuls-on-xla-cpu-2026-12-03).
``matmul`` computes ``x @ w`` (or ``x @ w.T``) with a custom gradient whose three dots are in
that form, through XLA's own dot op, which exists only inside an XLA cluster: outside one (a
plain ``tf.function`` graph, eager, an export) it is Keras' matmul. The TensorFlow backend
builds fxtrack's Keras models with it on a CPU at bf16 (``keras_models.matmul_form``).
"""

from __future__ import annotations

import keras
import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla as tfxla
from tensorflow.compiler.xla import xla_data_pb2
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.ops import control_flow_util

from fxtrack.frameworks.base import BF16_KERNEL_FORM


def fast_path(precision: str, device_kind: str, xla: bool) -> tuple[bool, str]:
    """Whether a run's matmuls take the bf16-kernel form, and why (``fxtrack.matmul_form``)."""
    if precision != "bf16":
        return False, f"TensorFlow's own matmuls ({precision})"
    if device_kind != "cpu":
        return False, f"TensorFlow's own matmuls (bf16 on {device_kind}: its dots take bf16 natively)"
    if not xla:
        return False, "TensorFlow's own matmuls (a plain tf.function graph: XLA's dot op needs XLA)"
    return True, BF16_KERNEL_FORM


def _dot(a: tf.Tensor, b: tf.Tensor, contract: tuple[int, int]) -> tf.Tensor:
    """a . b over a's axis contract[0] and b's axis contract[1], accumulated in float32."""
    dims = xla_data_pb2.DotDimensionNumbers(lhs_contracting_dimensions=[contract[0]],
                                            rhs_contracting_dimensions=[contract[1]])
    return tf.cast(tfxla.dot_general(a, b, dims, None, preferred_element_type=tf.float32),
                   a.dtype)


def _transposed(x: tf.Tensor) -> tf.Tensor:
    """x^T written out (a 2-D transpose would be folded into the dot: the slow form)."""
    m, k = tf.shape(x)[0], x.shape[1]
    return tf.reshape(tf.transpose(tf.reshape(x, (m, k, 1)), (1, 0, 2)), (k, m))


def _kernel_form(x: tf.Tensor, w: tf.Tensor, w_transposed: bool) -> tf.Tensor:
    @tf.custom_gradient
    def product(x, w):
        def grad(g):
            if w_transposed:  # w (N, K): dx = g w, dw = g^T x
                return _dot(g, w, (1, 0)), _dot(_transposed(g), x, (1, 0))
            return _dot(g, w, (1, 1)), _dot(_transposed(x), g, (1, 0))  # dx = g w^T, dw = x^T g

        return _dot(x, w, (1, 1 if w_transposed else 0)), grad

    return product(x, w)


def matmul(x, w, w_transposed: bool = False):
    """x (..., K) @ w (K, N), or x @ w.T for w (N, K) when ``w_transposed``, both in the compute
    dtype: in the bf16-kernel form inside an XLA cluster at bf16, else Keras' matmul."""
    in_xla = control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph())
    if x.dtype != tf.bfloat16 or w.dtype != tf.bfloat16 or not in_xla:
        return keras.ops.matmul(x, keras.ops.transpose(w) if w_transposed else w)
    k, n = x.shape[-1], w.shape[0 if w_transposed else 1]
    y = _kernel_form(tf.reshape(x, (-1, k)), w, w_transposed)
    return tf.reshape(y, tf.concat([tf.shape(x)[:-1], [n]], 0))
