"""scenario=generate for JAX (the ``generate`` capability, fxtrack.frameworks.decoding): greedy
decoding of the built Llama as two jitted pure functions over a cache pytree (per layer K and V,
preallocated to prompt_len + new_tokens positions). The prefill writes the prompt's keys and
values from position 0; the decode step writes one position with ``dynamic_update_slice`` at a
traced position that stays on the device, so one compiled step serves every position. Both
donate the cache: XLA updates it in place instead of copying it each token."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from fxtrack.frameworks.jax import train

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.jax.backend import JaxBackend


def _prefill(graphdef: nnx.GraphDef, params: nnx.State, stats: nnx.State, cache: Any,
             prompt: jax.Array) -> tuple[jax.Array, Any, jax.Array]:
    """(first new token (B,), filled cache, the next position) for ``prompt`` (B, P)."""
    logits, cache = nnx.merge(graphdef, params, stats).decode(prompt, cache)
    return jnp.argmax(logits, -1).astype(jnp.int32), cache, jnp.int32(prompt.shape[1])


def _step(graphdef: nnx.GraphDef, params: nnx.State, stats: nnx.State, cache: Any,
          token: jax.Array, pos: jax.Array) -> tuple[jax.Array, Any, jax.Array]:
    """(next token (B,), cache with ``token`` written at ``pos``, pos + 1)."""
    logits, cache = nnx.merge(graphdef, params, stats).decode(token[:, None], cache, pos)
    return jnp.argmax(logits, -1).astype(jnp.int32), cache, pos + 1


class JaxDecoder:
    """The Decoder protocol over the backend's live parameters (inference-mode graph)."""

    def __init__(self, backend: Any, prompt_len: int, new_tokens: int) -> None:
        self.params, self.stats = backend.state.params, backend.state.batch_stats
        self.graphdef = train.eval_graphdef(backend.graphdef, backend.state)
        self.length = prompt_len + new_tokens
        dtype = train.COMPUTE_DTYPES[backend.spec.precision]  # the cache in the compute dtype
        model = nnx.merge(self.graphdef, self.params, self.stats)  # wraps, copies nothing
        # On the parameters' mesh, as the jitted calls return it: else the second prefill,
        # reading the step's output, would compile again.
        self.cache = jax.device_put(model.init_cache(backend.batch_size, self.length, dtype),
                                    backend.replicated)
        self.pos: Any = None
        prefill, step = (functools.partial(f, self.graphdef) for f in (_prefill, _step))
        if backend.jit:  # cache donated (argument 2): each call rewrites it in place
            self._prefill = jax.jit(prefill, donate_argnums=2)
            self._step = jax.jit(step, donate_argnums=2)
        else:  # compile=false: op by op, as the training step ran (the compile_mode tag)
            self._prefill, self._step = train._eager(prefill), train._eager(step)
        self._forward = train.make_forward(self.graphdef, backend.jit)

    def prefill(self, prompt: np.ndarray) -> jax.Array:
        token, self.cache, self.pos = self._prefill(self.params, self.stats, self.cache, prompt)
        return token

    def step(self, token: jax.Array) -> jax.Array:
        token, self.cache, self.pos = self._step(self.params, self.stats, self.cache, token,
                                                 self.pos)
        return token

    def tokens(self, token: jax.Array) -> np.ndarray:
        return np.asarray(token.block_until_ready())

    def cache_bytes(self) -> int:
        return sum(x.nbytes for x in jax.tree.leaves(self.cache))

    def uncached(self, prompt: np.ndarray, new_tokens: int) -> np.ndarray:
        """Greedy tokens from a full forward at every step, no cache. The sequence sits in a
        fixed (B, prompt_len + new_tokens) buffer (one compile): with causal attention the
        positions after the current one cannot change its logits."""
        p = prompt.shape[1]
        seq = np.zeros((prompt.shape[0], p + new_tokens), np.int32)
        seq[:, :p] = prompt
        for i in range(new_tokens):
            # a copy: on a CPU the array may alias seq, written below
            logits = self._forward(self.params, self.stats, seq.copy())  # (B, p + N, vocab)
            seq[:, p + i] = np.asarray(jnp.argmax(logits[:, p + i - 1], -1))
        return seq[:, p:]


def prepare(backend: JaxBackend, prompt_len: int, new_tokens: int) -> JaxDecoder:
    return JaxDecoder(backend, prompt_len, new_tokens)
