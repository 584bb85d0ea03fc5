"""The generate capability for Keras (scenario=generate; fxtrack.frameworks.decoding): greedy
decoding of the built Keras Llama written once in ``keras.ops``, with a functional KV cache
(per layer K and V of shape (batch, prompt_len + new_tokens, kv_heads, head_dim), the run's
compute dtype, each step writing its position with ``ops.slice_update``), compiled the way the
model's training step is on each backend (``backend.compiled``, as ``model.jit_compile``
resolved it): ``jax.jit`` over the weights passed in through a ``keras.StatelessScope`` (not
closed over: they would become constants of the program); ``tf.function`` (XLA when
compiled); eager on torch (Keras' default there)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import keras
import numpy as np
from keras import ops

from fxtrack.frameworks.declaration import NotSupported
from fxtrack.frameworks.keras import devices
from fxtrack.frameworks.keras_models import gqa_attention

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.keras.backend import KerasBackend


def _compiled(fn: Callable[..., Any], model: keras.Model, compiled: bool,
              donate: tuple[int, ...] = ()) -> Callable[..., Any]:
    """``fn`` of backend tensors, compiled on this Keras backend as ``compiled`` says; on JAX
    the arguments at ``donate`` (a cache the call returns rewritten) are donated, so XLA updates
    their buffers in place instead of copying them per call."""
    name = devices.backend_name()
    if name == "jax" and compiled:
        import jax

        variables = model.variables

        def pure(values: list, *args: Any) -> Any:
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return fn(*args)

        jitted = jax.jit(pure, donate_argnums=tuple(i + 1 for i in donate))  # after values
        return lambda *args: jitted([v.value for v in variables], *args)
    if name == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=compiled)
    if name == "torch":
        if compiled:
            raise NotSupported("scenario=generate and serve with framework.compile=true are not "
                               "supported by keras on torch: its decode runs eagerly (Keras' "
                               "default there); use framework.compile=auto or false")
        import torch

        def no_grad(*args: Any) -> Any:
            with torch.no_grad():  # no autograd graph per step
                return fn(*args)

        return no_grad
    return fn  # JAX uncompiled: op by op


class KerasDecoder:
    """A ``fxtrack.frameworks.decoding.Decoder`` over ``backend.model`` (a
    ``keras_models.Llama``); the cache and position live on the device between calls."""

    def __init__(self, backend: Any, prompt_len: int, new_tokens: int) -> None:
        self.model = backend.model
        self.prompt_len, self.length = prompt_len, prompt_len + new_tokens
        block = self.model.blocks[0]
        self.shape = (int(backend.x.shape[0]), self.length, block.kv_heads, block.head_dim)
        self.dtype = block.compute_dtype
        self._prefill = _compiled(self._prefill_fn, self.model, backend.compiled)
        self._step = _compiled(self._step_fn, self.model, backend.compiled)
        self._full = _compiled(self._full_fn, self.model, backend.compiled)
        self.state: Any = None  # (cache, position) after a prefill

    # -- the compiled functions
    def _prefill_fn(self, ids: Any) -> tuple[Any, list, Any]:
        x = self.model.embed(ids)
        positions = ops.arange(self.prompt_len)
        cache = []
        for block in self.model.blocks:
            q, k, v = block.qkv(x, positions)
            empty = ops.zeros(self.shape, self.dtype)
            cache.append((ops.slice_update(empty, [0, 0, 0, 0], k),
                          ops.slice_update(empty, [0, 0, 0, 0], v)))
            x = block.finish(x, gqa_attention(q, k, v))
        position = ops.convert_to_tensor(self.prompt_len, "int32")
        return _argmax(self.model.logits(x[:, -1:])), cache, position

    def _step_fn(self, token: Any, cache: list, pos: Any) -> tuple[Any, list, Any]:
        x = self.model.embed(ops.expand_dims(token, 1))  # (B, 1, C)
        visible = ops.reshape(ops.arange(self.length) <= pos, (1, 1, 1, self.length))
        start = [0, pos, 0, 0]
        updated = []
        for block, (k_cache, v_cache) in zip(self.model.blocks, cache):
            q, k, v = block.qkv(x, ops.reshape(pos, (1,)))
            k_cache = ops.slice_update(k_cache, start, k)
            v_cache = ops.slice_update(v_cache, start, v)
            updated.append((k_cache, v_cache))
            x = block.finish(x, gqa_attention(q, k_cache, v_cache, mask=visible))
        return _argmax(self.model.logits(x)), updated, pos + 1

    def _full_fn(self, ids: Any) -> Any:
        return ops.argmax(ops.cast(self.model(ids), "float32"), axis=-1)

    # -- the Decoder protocol
    def prefill(self, prompt: np.ndarray) -> Any:
        token, cache, position = self._prefill(ops.convert_to_tensor(prompt, "int32"))
        self.state = (cache, position)
        return token

    def step(self, token: Any) -> Any:
        token, cache, position = self._step(token, *self.state)
        self.state = (cache, position)
        return token

    def tokens(self, token: Any) -> np.ndarray:
        return ops.convert_to_numpy(token)  # the copy to the host waits for the device

    def cache_bytes(self) -> int:
        itemsize = np.dtype(self.dtype).itemsize if self.dtype != "bfloat16" else 2
        return 2 * len(self.model.blocks) * int(np.prod(self.shape)) * itemsize

    def uncached(self, prompt: np.ndarray, new_tokens: int) -> np.ndarray:
        """The full causal forward at every step, without the cache, on a fixed
        (batch, prompt_len + new_tokens) buffer (one compilation): the positions not generated
        yet hold zeros, which causal attention keeps from every position read."""
        seq = np.zeros((prompt.shape[0], self.length), np.int32)
        seq[:, : self.prompt_len] = prompt
        for t in range(new_tokens):
            argmax = ops.convert_to_numpy(self._full(ops.convert_to_tensor(seq)))
            seq[:, self.prompt_len + t] = argmax[:, self.prompt_len + t - 1]
        return seq[:, self.prompt_len: self.prompt_len + new_tokens]


def _argmax(logits: Any) -> Any:
    """(B, 1, vocab) logits -> (B,) int32 greedy tokens (argmax in fp32)."""
    return ops.cast(ops.argmax(ops.cast(logits[:, -1], "float32"), axis=-1), "int32")


def prepare(backend: KerasBackend, prompt_len: int, new_tokens: int) -> KerasDecoder:
    """The decoder for the built model, its cache sized ``prompt_len + new_tokens``."""
    return KerasDecoder(backend, prompt_len, new_tokens)
