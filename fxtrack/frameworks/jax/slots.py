"""scenario=serve's ``scenario.batching=continuous`` for JAX
(fxtrack.scenarios.batching.SlotDecoder): one cache pytree of ``slots`` rows, each row a slot at
its own position, as two jitted pure functions that donate the cache.

A request's prefill runs at admission on its slot's row alone (sliced out and written back at a
traced slot index: one compile per prompt bucket, whatever the slot), its prompt padded at the
end to the smallest prompt bucket that holds it and its first token read at its last real
position; the padded positions' K/V are hidden by each row's length until decode overwrites
them. A decode step runs every slot at once, each at its own position (a (slots,) position
array); only the occupied slots advance. Whole prefill (not chunked)."""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from fxtrack.frameworks.jax import train

if TYPE_CHECKING:
    from fxtrack.frameworks.jax.backend import JaxBackend

PREFILL = "whole"  # a request's prompt in one pass at admission (not chunked)


def _prefill(graphdef: nnx.GraphDef, params: nnx.State, stats: nnx.State, cache: Any,
             ids: jax.Array, slot: jax.Array, length: jax.Array) -> tuple[jax.Array, Any]:
    """(the slot's first token, the cache with the slot's row refilled from position 0)."""
    row = jax.tree.map(lambda c: jax.lax.dynamic_slice_in_dim(c, slot, 1, axis=0), cache)
    logits, row = nnx.merge(graphdef, params, stats).decode(ids, row, last=length - 1)
    cache = jax.tree.map(lambda c, r: jax.lax.dynamic_update_slice_in_dim(c, r, slot, axis=0),
                         cache, row)
    return jnp.argmax(logits[0], -1).astype(jnp.int32), cache


def _step(graphdef: nnx.GraphDef, params: nnx.State, stats: nnx.State, cache: Any,
          token: jax.Array, pos: jax.Array) -> tuple[jax.Array, Any]:
    """(each slot's next token (slots,), the cache with each row's token written at its pos)."""
    logits, cache = nnx.merge(graphdef, params, stats).decode(token[:, None], cache, pos)
    return jnp.argmax(logits, -1).astype(jnp.int32), cache


class JaxSlots:
    def __init__(self, backend: JaxBackend, slots: int, prompt_buckets: Sequence[int],
                 longest: int) -> None:
        self.params, self.stats = backend.state.params, backend.state.batch_stats
        graphdef = train.eval_graphdef(backend.graphdef, backend.state)
        self.buckets = sorted(prompt_buckets)
        dtype = train.COMPUTE_DTYPES[backend.spec.precision]
        model = nnx.merge(graphdef, self.params, self.stats)
        self.cache = jax.device_put(
            model.init_cache(slots, self.buckets[-1] + longest, dtype), backend.replicated)
        rng = np.random.default_rng(backend.spec.seed)  # one seeded prompt: a request reads n
        self.ids = rng.integers(0, backend.arch.vocab_size, (1, self.buckets[-1])).astype(np.int32)
        self.pos = np.zeros(slots, np.int32)
        self.token = np.zeros(slots, np.int32)
        self.last = np.zeros(slots, np.int64)  # each slot's latest token, read back
        prefill, step = (functools.partial(f, graphdef) for f in (_prefill, _step))
        if backend.jit:  # the cache donated (argument 2): rewritten in place
            self._prefill = jax.jit(prefill, donate_argnums=2)
            self._step = jax.jit(step, donate_argnums=2)
        else:
            self._prefill, self._step = train._eager(prefill), train._eager(step)

    def prefill(self, slot: int, prompt_len: int) -> float:
        padded = min(b for b in self.buckets if b >= prompt_len)
        token, self.cache = self._prefill(self.params, self.stats, self.cache,
                                          self.ids[:, :padded], np.int32(slot),
                                          np.int32(prompt_len))
        self.last[slot] = self.token[slot] = int(token)  # waits for the device
        self.pos[slot] = prompt_len
        return time.perf_counter()

    def step(self, slots: Sequence[int]) -> float:
        out, self.cache = self._step(self.params, self.stats, self.cache, self.token, self.pos)
        self.last = np.array(out.block_until_ready())  # a writable copy: prefill sets a slot
        self.token = self.last.astype(np.int32)
        self.pos[list(slots)] += 1
        return time.perf_counter()


def prepare_slots(backend: JaxBackend, slots: int, prompt_buckets: Sequence[int],
                  longest: int) -> JaxSlots:
    return JaxSlots(backend, slots, prompt_buckets, longest)
