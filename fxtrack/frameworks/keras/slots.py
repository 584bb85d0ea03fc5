"""scenario=serve's ``scenario.batching=continuous`` for Keras 3
(fxtrack.scenarios.batching.SlotDecoder), on whichever backend Keras runs (jax, torch,
tensorflow): written once in ``keras.ops`` over the model's own layers, as the generate
decoder (fxtrack.frameworks.keras.generate) is, and compiled as it is (its ``_compiled``: jit
on JAX, donating the cache; ``tf.function``, XLA when compiled; eager on torch).

One functional KV cache, allocated once: per layer K and V of shape (slots, longest prompt
bucket + longest output, kv_heads, head_dim), each row a slot at its own position, passed
through each call and returned updated (on JAX its buffers donated and rewritten in place; on
TensorFlow and torch each call returns an updated copy, as the generate decoder's step does).
A request's prefill runs at admission into its slot's row alone (``ops.slice_update`` at a
traced slot index: one compile per prompt bucket, whatever the slot), its prompt padded at the
end to the smallest prompt bucket that holds it and its first token gathered at its last real
position (a traced index too); the padded positions' K/V are hidden by each row's mask until
decode overwrites them. A decode step runs every slot at once (one static shape), each at its
own position (a (slots,) position tensor; K/V written with ``ops.scatter_update`` at (row,
position)); only the occupied slots advance. Whole prefill (not chunked)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from keras import ops

from fxtrack.frameworks.keras.generate import _argmax, _compiled
from fxtrack.frameworks.keras_models import gqa_attention

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.keras.backend import KerasBackend

PREFILL = "whole"  # a request's prompt in one pass at admission (not chunked)


class KerasSlots:
    def __init__(self, backend: KerasBackend, slots: int, prompt_buckets: Sequence[int],
                 longest: int) -> None:
        self.model = backend.model
        self.buckets = sorted(prompt_buckets)
        self.length = self.buckets[-1] + longest
        block = self.model.blocks[0]
        shape = (slots, self.length, block.kv_heads, block.head_dim)
        self.cache = [(ops.zeros(shape, block.compute_dtype), ops.zeros(shape, block.compute_dtype))
                      for _ in self.model.blocks]
        rng = np.random.default_rng(backend.spec.seed)  # one seeded prompt: a request reads n
        self.ids = rng.integers(0, backend.arch.vocab_size, (1, self.buckets[-1])).astype(np.int32)
        self.pos = np.zeros(slots, np.int32)
        self.token = np.zeros(slots, np.int32)
        self.last = np.zeros(slots, np.int64)  # each slot's latest token, read back
        # the cache (argument 0) donated on JAX: rewritten in place, not copied per call
        self._prefill = _compiled(self._prefill_fn, self.model, backend.compiled, donate=(0,))
        self._step = _compiled(self._step_fn, self.model, backend.compiled, donate=(0,))

    # -- the compiled functions
    def _prefill_fn(self, cache: list, ids: Any, slot: Any, last: Any) -> tuple[Any, list]:
        """(the slot's first token, the cache with the slot's row written from position 0)."""
        padded = ids.shape[1]
        x = self.model.embed(ids)
        start = [slot, 0, 0, 0]
        updated = []
        for block, (k_cache, v_cache) in zip(self.model.blocks, cache):
            q, k, v = block.qkv(x, ops.arange(padded))
            updated.append((ops.slice_update(k_cache, start, k),
                            ops.slice_update(v_cache, start, v)))
            x = block.finish(x, gqa_attention(q, k, v))  # causal: the padding is after
        # a gather, not a slice: XLA under TensorFlow compiles a slice's start as a constant,
        # one program per prompt length
        x = ops.take(x, ops.reshape(last, (1,)), axis=1)
        return _argmax(self.model.logits(x))[0], updated

    def _step_fn(self, cache: list, token: Any, pos: Any) -> tuple[Any, list]:
        """(each slot's next token (slots,), the cache with each row's K/V at its position)."""
        x = self.model.embed(ops.expand_dims(token, 1))  # (slots, 1, C)
        rows = ops.shape(pos)[0]
        visible = ops.expand_dims(ops.arange(self.length)[None, :] <= pos[:, None], (1, 2))
        at = ops.stack([ops.arange(rows, dtype="int32"), pos], axis=1)  # (slots, 2): row, pos
        updated = []
        for block, (k_cache, v_cache) in zip(self.model.blocks, cache):
            q, k, v = block.qkv(x, pos[:, None])
            k_cache = ops.scatter_update(k_cache, at, k[:, 0])
            v_cache = ops.scatter_update(v_cache, at, v[:, 0])
            updated.append((k_cache, v_cache))
            x = block.finish(x, gqa_attention(q, k_cache, v_cache, mask=visible))
        return _argmax(self.model.logits(x)), updated

    # -- the SlotDecoder protocol
    def prefill(self, slot: int, prompt_len: int) -> float:
        padded = min(b for b in self.buckets if b >= prompt_len)
        token, self.cache = self._prefill(self.cache,
                                          ops.convert_to_tensor(self.ids[:, :padded], "int32"),
                                          ops.convert_to_tensor(slot, "int32"),
                                          ops.convert_to_tensor(prompt_len - 1, "int32"))
        self.last[slot] = self.token[slot] = int(ops.convert_to_numpy(token))  # waits
        self.pos[slot] = prompt_len
        return time.perf_counter()

    def step(self, slots: Sequence[int]) -> float:
        out, self.cache = self._step(self.cache, ops.convert_to_tensor(self.token, "int32"),
                                     ops.convert_to_tensor(self.pos, "int32"))
        self.last = np.array(ops.convert_to_numpy(out), np.int64)  # the copy waits
        self.token = self.last.astype(np.int32)
        self.pos[list(slots)] += 1
        return time.perf_counter()


def prepare_slots(backend: KerasBackend, slots: int, prompt_buckets: Sequence[int],
                  longest: int) -> KerasSlots:
    return KerasSlots(backend, slots, prompt_buckets, longest)
