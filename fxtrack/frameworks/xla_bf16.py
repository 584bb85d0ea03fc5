"""bf16 matmuls on XLA:CPU in the one form its bf16 kernels take; 1x1 convolutions as matmuls.

XLA:CPU (jaxlib 0.10, YNNPACK) runs a bf16 x bf16 dot on its bf16 kernels (AMX / AVX512-BF16)
only when the dot asks for a float32 result and its left operand contracts its last axis. A
bf16-result dot (what ``nnx.Linear`` and a plain ``x @ w`` ask for), and a weight gradient
``x^T g`` (left operand contracting its first axis), are upcast to float32 instead and run 3-5x
slower (docs/measurements.md#bf16-matmuls-on-xla-cpu-2026-12-03). ``matmul`` computes
``x @ w`` (or ``x @ w.T``) with a custom VJP whose three dots (forward, input gradient, weight
gradient) are all in that form: bf16 operands, float32 accumulation, bf16 result, as a GPU's
tensor cores and torch's autocast compute them. Elsewhere (a GPU, fp32, fp16) it is the plain
dot. ``fast_path`` decides, and its answer is the ``fxtrack.matmul_form`` tag.

JAX's own terms, shared by framework=jax and by Keras on its JAX backend (which builds fxtrack's
Keras models with it, ``keras_models.matmul_form``); each framework's calibration times
``PROBE_PRODUCT``, so its peak is the rate of the product its models compute. Imported only by
those two, in the worker, after JAX's environment is prepared.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from fxtrack.frameworks.base import BF16_KERNEL_FORM

ENABLED = True  # tests turn it off to compare with XLA's own dots
CONVS_AS_MATMULS = True  # tests and bench/conv_form.py turn it off to compare with XLA's convs


def fast_path(dtype: Any, platform: str) -> tuple[bool, str]:
    """Whether matmuls of ``dtype`` on ``platform`` take the bf16-kernel form, and why (the
    ``fxtrack.matmul_form`` tag)."""
    if not ENABLED:
        return False, "XLA's own dots (bf16 form off)"
    if jnp.dtype(dtype) != jnp.bfloat16:
        return False, f"XLA's own dots ({jnp.dtype(dtype).name})"
    if platform != "cpu":
        return False, f"XLA's own dots (bf16 on {platform}: its dots take bf16 natively)"
    return True, BF16_KERNEL_FORM


def _dot(a: jax.Array, b: jax.Array, contract: tuple[int, int]) -> jax.Array:
    """a . b over a's axis contract[0] and b's axis contract[1], accumulated in float32."""
    dims = (((contract[0],), (contract[1],)), ((), ()))
    return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32).astype(a.dtype)


def _transposed(x: jax.Array) -> jax.Array:
    """x^T written out: XLA folds a 2-D transpose into the dot's dimension numbers (the slow
    form); a swap of a 3-D view is not folded, so the dot reads a row-major x^T."""
    m, k = x.shape
    return jnp.swapaxes(x.reshape(m, k, 1), 0, 1).reshape(k, m)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _matmul(x: jax.Array, w: jax.Array, w_transposed: bool) -> jax.Array:
    """x (M, K) @ w (K, N), or @ w.T for w (N, K) when ``w_transposed``."""
    return _dot(x, w, (1, 1 if w_transposed else 0))


def _forward(x: jax.Array, w: jax.Array, w_transposed: bool):
    return _matmul(x, w, w_transposed), (x, w)


def _backward(w_transposed: bool, saved: tuple[jax.Array, jax.Array], g: jax.Array):
    x, w = saved
    if w_transposed:  # w (N, K): dx = g w, dw = g^T x
        return _dot(g, w, (1, 0)), _dot(_transposed(g), x, (1, 0))
    return _dot(g, w, (1, 1)), _dot(_transposed(x), g, (1, 0))  # w (K, N): dx = g w^T, dw = x^T g


_matmul.defvjp(_forward, _backward)


def matmul(x: jax.Array, w: jax.Array, w_transposed: bool = False) -> jax.Array:
    """x (..., K) @ w (K, N) -> (..., N), or x @ w.T for w (N, K) when ``w_transposed``, both
    already in the compute dtype; in the bf16-kernel form where ``fast_path`` says so."""
    if x.dtype != w.dtype or not fast_path(x.dtype, jax.default_backend())[0]:
        return jnp.matmul(x, w.T if w_transposed else w)
    return _kernel_form(x, w, w_transposed)


def _kernel_form(x: jax.Array, w: jax.Array, w_transposed: bool) -> jax.Array:
    """``_matmul`` over x's leading axes flattened into one."""
    n = w.shape[0 if w_transposed else 1]
    y = _matmul(x.reshape(-1, x.shape[-1]), w, w_transposed)
    return y.reshape(*x.shape[:-1], n)


def dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers: Any, precision: Any = None,
                preferred_element_type: Any = None, **kwargs: Any) -> jax.Array:
    """``nnx.Linear(dot_general=...)``: its dot (inputs' last axis with the kernel's first) as
    ``matmul``; any other dot as ``lax.dot_general``."""
    (lc, rc), (lb, rb) = dimension_numbers
    if (tuple(lc) == (lhs.ndim - 1,) and tuple(rc) == (0,) and not lb and not rb
            and rhs.ndim == 2 and lhs.dtype == rhs.dtype and preferred_element_type is None
            and kwargs.get("out_sharding") is None
            and fast_path(lhs.dtype, jax.default_backend())[0]):
        return _kernel_form(lhs, rhs, False)
    return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type, **kwargs)


# The ``fxtrack.conv_form`` tag of a ResNet whose 1x1 convolutions run as the products they are.
POINTWISE_AS_MATMUL = ("1x1 convolutions as matmuls (XLA:CPU runs them as convolutions at up to "
                       "a quarter of the dot's rate at fp32, a twelfth at bf16)")


def conv_form(platform: str) -> tuple[bool, str]:
    """Whether 1x1 convolutions run as matmuls (``pointwise_conv``) on ``platform``, and why (the
    ``fxtrack.conv_form`` tag): on a CPU, where XLA's convolution of ResNet-50's 1x1 kernels runs
    at 0.02-0.14 TFLOP/s and the same products as dots at 1.0-4.4x that at fp32, 4.4-12.7x at bf16
    in the kernel form (``python bench/conv_form.py --layers``, docs/results/mfu-2026-12-05.md).
    A GPU's convolutions are left to XLA (cuDNN)."""
    if not CONVS_AS_MATMULS:
        return False, "XLA's own convolutions (1x1 form off)"
    if platform != "cpu":
        return False, f"XLA's own convolutions (on {platform})"
    return True, POINTWISE_AS_MATMUL


def pointwise_conv(x: jax.Array, kernel: jax.Array, strides: Any) -> jax.Array:
    """An unpadded 1x1 convolution of x (B, H, W, in) with kernel (1, 1, in, out) as its
    product: x subsampled by the stride, times the kernel as (in, out), through ``matmul`` (the
    bf16-kernel form where it applies). The same sums as the convolution, in a dot."""
    sh, sw = strides
    return matmul(x[:, ::sh, ::sw, :], kernel.reshape(kernel.shape[-2:]).astype(x.dtype))


# The peak-FLOP/s probe's product (fxtrack.measure.matmul_probe), jitted once per process: at
# bf16 on a CPU the kernel form, whose rate XLA's own bf16 dot (upcast to float32) is a fifth of.
PROBE_PRODUCT = jax.jit(matmul)
