"""scenario=serve's ``scenario.batching=continuous`` for TensorFlow
(fxtrack.scenarios.batching.SlotDecoder): the KV cache in ``tf.Variable``s of ``slots`` rows,
each row a slot at its own position, one ``tf.function`` per call (XLA when ``spec.compile``).

A request's prefill runs at admission on its slot's row alone (a scatter at a traced slot
index: one trace and one XLA program per prompt bucket, whatever the slot and length), its
prompt padded at the end to the smallest prompt bucket that holds it and its first token read
(a gather) at its last real position; the
padded positions' K/V are masked until decode overwrites them. A decode step runs every slot at
once, each at its own position (a scatter into the cache); only the occupied slots advance.
Whole prefill (not chunked)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

import numpy as np
import tensorflow as tf

from fxtrack.frameworks.keras_models import gqa_attention
from fxtrack.frameworks.tensorflow.generate import _argmax, kv_cache

if TYPE_CHECKING:
    from fxtrack.frameworks.tensorflow.backend import TensorFlowBackend

PREFILL = "whole"  # a request's prompt in one pass at admission (not chunked)


class TensorFlowSlots:
    def __init__(self, backend: TensorFlowBackend, slots: int, prompt_buckets: Sequence[int],
                 longest: int) -> None:
        self.model, self.device = backend.model, backend.device
        self.buckets = sorted(prompt_buckets)
        self.length = self.buckets[-1] + longest
        self.cache = kv_cache(self.model, self.device, slots, self.length)
        rng = np.random.default_rng(backend.spec.seed)  # one seeded prompt: a request reads n
        self.ids = rng.integers(0, backend.arch.vocab_size, (1, self.buckets[-1])).astype(np.int32)
        self.pos = np.zeros(slots, np.int32)
        self.token = np.zeros(slots, np.int32)
        self.last = np.zeros(slots, np.int64)  # each slot's latest token, read back
        jit = bool(backend.spec.compile)
        self._prefill = tf.function(self._prefill_fn, jit_compile=jit)
        self._step = tf.function(self._step_fn, jit_compile=jit)

    def _prefill_fn(self, ids: tf.Tensor, slot: tf.Tensor, last: tf.Tensor) -> tf.Tensor:
        padded = ids.shape[1]
        x = self.model.embed(ids)
        positions = tf.range(padded)
        # the slot's rows by a scatter and the last position by a gather: as a slice's bounds
        # XLA takes both as compile-time constants and compiled again for every new (slot,
        # length), about 0.5 s a prefill on 2 CPU cores
        at = tf.stack([tf.fill([padded], slot), positions], axis=1)  # (padded, 2): row, position
        for block, (k_cache, v_cache) in zip(self.model.blocks, self.cache):
            q, k, v = block.qkv(x, positions)
            k_cache.scatter_nd_update(at, k[0])
            v_cache.scatter_nd_update(at, v[0])
            x = block.finish(x, gqa_attention(q, k, v))
        return _argmax(self.model.logits(tf.gather(x, last[None], axis=1)))[0]

    def _step_fn(self, token: tf.Tensor, pos: tf.Tensor) -> tf.Tensor:
        x = self.model.embed(token[:, None])  # (slots, 1, C)
        visible = (tf.range(self.length)[None, :] <= pos[:, None])[:, None, None, :]
        at = tf.stack([tf.range(tf.shape(pos)[0]), pos], axis=1)  # (slots, 2): row, position
        for block, (k_cache, v_cache) in zip(self.model.blocks, self.cache):
            q, k, v = block.qkv(x, pos[:, None])
            k_cache.scatter_nd_update(at, k[:, 0])
            v_cache.scatter_nd_update(at, v[:, 0])
            x = block.finish(x, gqa_attention(q, k_cache.read_value(), v_cache.read_value(),
                                              mask=visible))
        return _argmax(self.model.logits(x))

    def prefill(self, slot: int, prompt_len: int) -> float:
        padded = min(b for b in self.buckets if b >= prompt_len)
        with tf.device(self.device):
            token = self._prefill(tf.constant(self.ids[:, :padded]), tf.constant(slot, tf.int32),
                                  tf.constant(prompt_len - 1, tf.int32))
        self.last[slot] = self.token[slot] = int(token.numpy())  # waits for the device
        self.pos[slot] = prompt_len
        return time.perf_counter()

    def step(self, slots: Sequence[int]) -> float:
        with tf.device(self.device):
            out = self._step(tf.constant(self.token), tf.constant(self.pos))
        self.last = np.array(out.numpy())  # the copy to the host waits for the device
        self.token = self.last.astype(np.int32)
        self.pos[list(slots)] += 1
        return time.perf_counter()


def prepare_slots(backend: TensorFlowBackend, slots: int, prompt_buckets: Sequence[int],
                  longest: int) -> TensorFlowSlots:
    return TensorFlowSlots(backend, slots, prompt_buckets, longest)
