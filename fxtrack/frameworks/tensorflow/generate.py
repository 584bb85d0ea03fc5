"""The generate capability for TensorFlow (scenario=generate; fxtrack.frameworks.decoding): greedy
decoding of the built Keras Llama with its KV cache in ``tf.Variable``s, one compiled
``tf.function`` for the prefill and one for a decode step (XLA when ``spec.compile``).

The cache holds, per layer, K and V of shape (batch, prompt_len + new_tokens, kv_heads, head_dim)
(Keras' attention layout) in the run's compute dtype, preallocated once. The prefill writes
positions [0, prompt_len); each step writes its one position in place (a scatter into the
variable at the position it reads: one XLA program for every position) and attends over the
whole cache with the positions not yet written masked out. The position itself is a device
variable, so a step is one call with no host value but the token handle."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf
from keras import ops

from fxtrack.frameworks.keras_models import gqa_attention

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.tensorflow.backend import TensorFlowBackend


def kv_cache(model: Any, device: str, rows: int, length: int) -> list:
    """Per layer of ``model`` (a ``keras_models.Llama``), K and V variables of shape (rows,
    length, kv_heads, head_dim) in its compute dtype, zeroed, on ``device``."""
    block = model.blocks[0]
    shape = (rows, length, block.kv_heads, block.head_dim)
    with tf.device(device):
        return [(tf.Variable(tf.zeros(shape, block.compute_dtype), trainable=False),
                 tf.Variable(tf.zeros(shape, block.compute_dtype), trainable=False))
                for _ in model.blocks]


class TensorFlowDecoder:
    """A ``fxtrack.frameworks.decoding.Decoder`` over ``backend.model`` (a ``keras_models.Llama``)."""

    def __init__(self, backend: Any, prompt_len: int, new_tokens: int) -> None:
        self.model, self.device = backend.model, backend.device
        self.prompt_len, self.length = prompt_len, prompt_len + new_tokens
        batch = int(backend.replica_batch()["input_ids"].shape[0])  # the built batch_size
        self.cache = kv_cache(self.model, self.device, batch, self.length)
        with tf.device(self.device):
            self.position = tf.Variable(0, dtype=tf.int32, trainable=False)
        jit = bool(backend.spec.compile)
        self._prefill = tf.function(self._prefill_fn, jit_compile=jit)
        self._step = tf.function(self._step_fn, jit_compile=jit)
        self._full = tf.function(self._full_fn, jit_compile=jit)

    # -- the compiled functions
    def _prefill_fn(self, ids: tf.Tensor) -> tf.Tensor:
        x = self.model.embed(ids)
        positions = tf.range(self.prompt_len)
        for block, (k_cache, v_cache) in zip(self.model.blocks, self.cache):
            q, k, v = block.qkv(x, positions)
            k_cache[:, : self.prompt_len].assign(k)
            v_cache[:, : self.prompt_len].assign(v)
            x = block.finish(x, gqa_attention(q, k, v))
        self.position.assign(self.prompt_len)
        return _argmax(self.model.logits(x[:, -1:]))  # only the last position is projected

    def _step_fn(self, token: tf.Tensor) -> tf.Tensor:
        pos = self.position.read_value()
        x = self.model.embed(token[:, None])  # (B, 1, C)
        visible = (tf.range(self.length) <= pos)[None, None, None, :]  # (1, 1, 1, L)
        # each row's position by a scatter: as a slice's bounds XLA took the position for a
        # compile-time constant and compiled the step again at every new one (about 0.6 s each
        # on 2 CPU cores: a 128-token request's first decode took over a minute)
        rows = tf.shape(token)[0]
        at = tf.stack([tf.range(rows), tf.fill([rows], pos)], axis=1)  # (B, 2): row, position
        for block, (k_cache, v_cache) in zip(self.model.blocks, self.cache):
            q, k, v = block.qkv(x, pos[None])
            k_cache.scatter_nd_update(at, k[:, 0])
            v_cache.scatter_nd_update(at, v[:, 0])
            x = block.finish(x, gqa_attention(q, k_cache.read_value(), v_cache.read_value(),
                                              mask=visible))
        self.position.assign_add(1)
        return _argmax(self.model.logits(x))

    def _full_fn(self, ids: tf.Tensor) -> tf.Tensor:
        return tf.argmax(self.model(ids, training=False), axis=-1, output_type=tf.int32)

    # -- the Decoder protocol
    def prefill(self, prompt: np.ndarray) -> tf.Tensor:
        with tf.device(self.device):
            return self._prefill(tf.constant(prompt, tf.int32))

    def step(self, token: tf.Tensor) -> tf.Tensor:
        with tf.device(self.device):
            return self._step(token)

    def tokens(self, token: tf.Tensor) -> np.ndarray:
        return token.numpy()  # the copy to the host waits for the device

    def cache_bytes(self) -> int:
        return sum(int(np.prod(v.shape)) * v.dtype.size for pair in self.cache for v in pair)

    def uncached(self, prompt: np.ndarray, new_tokens: int) -> np.ndarray:
        """The full causal forward at every step, without the cache, on a fixed
        (batch, prompt_len + new_tokens) buffer (one trace): the positions not generated yet
        hold zeros, which causal attention keeps from every position read."""
        seq = np.zeros((prompt.shape[0], self.length), np.int32)
        seq[:, : self.prompt_len] = prompt
        for t in range(new_tokens):
            with tf.device(self.device):
                argmax = self._full(tf.constant(seq)).numpy()
            seq[:, self.prompt_len + t] = argmax[:, self.prompt_len + t - 1]
        return seq[:, self.prompt_len: self.prompt_len + new_tokens]


def _argmax(logits: Any) -> tf.Tensor:
    """(B, 1, vocab) logits -> (B,) int32 greedy tokens (argmax in fp32)."""
    return tf.argmax(ops.cast(logits[:, -1], "float32"), axis=-1, output_type=tf.int32)


def prepare(backend: TensorFlowBackend, prompt_len: int, new_tokens: int) -> TensorFlowDecoder:
    """The decoder for the built model, its cache sized ``prompt_len + new_tokens``."""
    return TensorFlowDecoder(backend, prompt_len, new_tokens)
