"""What a framework's ``generate`` capability returns (scenario=generate): a greedy decoder over
the built LM with a KV cache. Imports no framework; each framework's ``generate`` module
implements it in its own idiom, and fxtrack.scenarios.generate times it with the one timer.

The scenario calls, for each generation of ``batch_size`` sequences::

    token = decoder.prefill(prompt)        # the prompt in one pass; the first new token
    decoder.tokens(token)                  # wait for the device: time to first token
    for _ in range(new_tokens - 1):
        token = decoder.step(token)        # one position through the cache
        decoder.tokens(token)              # wait: one decode step's latency

and checks once, against ``uncached``, that the cache changed nothing."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Decoder(Protocol):
    """Greedy decoding of the backend's built model, its cache sized ``prompt_len + new_tokens``
    positions (made by ``prepare``, reused by every generation: ``prefill`` starts afresh)."""

    def prefill(self, prompt: np.ndarray) -> Any:
        """Run ``prompt`` ((batch, prompt_len) int32) through the model, filling the cache from
        position 0; return the argmax of the last position's logits ((batch,) token ids) as a
        device handle, without waiting for it."""

    def step(self, token: Any) -> Any:
        """Feed ``token`` (the handle ``prefill`` or the previous ``step`` returned) at the next
        position, through the cache; return the next token's handle, without waiting for it."""

    def tokens(self, token: Any) -> np.ndarray:
        """Wait for the device and return ``token``'s values ((batch,) integers)."""

    def cache_bytes(self) -> int:
        """Bytes the KV cache holds on the device (keys and values of every layer)."""

    def uncached(self, prompt: np.ndarray, new_tokens: int) -> np.ndarray:
        """The reference: ``new_tokens`` greedy tokens ((batch, new_tokens)) from a full forward
        over the whole sequence so far at every step, no cache."""
