"""scenario=serve's ``scenario.batching=continuous`` for PyTorch
(fxtrack.scenarios.batching.SlotDecoder): one static KV cache of ``slots`` rows, each row a slot
at its own position.

A request's prefill runs at admission on its slot's rows of the cache alone (a view: the
forward writes the shared tensors in place), its prompt padded at the end to the smallest
prompt bucket that holds it (the scenario's ``batching.prompt_buckets``) and its first token read at its last
real position; padded positions hold K/V that the per-row mask hides until decode overwrites
them. A decode step runs every slot at once (one static shape), each at its own position; only
the occupied slots advance. Whole prefill (not chunked)."""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from fxtrack.frameworks.torch import FRAMEWORK
from fxtrack.frameworks.torch.generate import _context
from fxtrack.frameworks.torch.train import AMP_DTYPES

if TYPE_CHECKING:
    from fxtrack.frameworks.torch.backend import TorchBackend

PREFILL = "whole"  # a request's prompt in one pass at admission (not chunked)


class TorchSlots:
    def __init__(self, backend: TorchBackend, slots: int, prompt_buckets: Sequence[int],
                 longest: int) -> None:
        self.model, self.device = backend.model.eval(), backend.device
        self.amp = AMP_DTYPES[backend.spec.precision]
        arch = backend.arch
        self.buckets = sorted(prompt_buckets)
        prompt_len = self.buckets[-1]
        shape = (slots, arch.kv_heads, prompt_len + longest, arch.hidden // arch.heads)
        dtype = self.amp or torch.float32
        self.cache = [(torch.zeros(shape, dtype=dtype, device=self.device),
                       torch.zeros(shape, dtype=dtype, device=self.device))
                      for _ in range(arch.layers)]
        # one seeded synthetic prompt; a request of n tokens reads its first n (``ids`` on the
        # host, as the SlotDecoder protocol has it, for the output check)
        rng = np.random.default_rng(backend.spec.seed)
        self.ids = rng.integers(0, arch.vocab_size, (1, prompt_len))
        self._ids = torch.from_numpy(self.ids).to(self.device)
        self.pos = torch.zeros(slots, 1, dtype=torch.long, device=self.device)
        self.token = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.last = np.zeros(slots, dtype=np.int64)  # each slot's latest token, read back
        self._prefill, self._step = self._prefill_fn, self._step_fn
        if backend.spec.compile:
            mode = FRAMEWORK.setting(backend.spec, "compile_mode")
            compile_ = functools.partial(torch.compile, mode=None if mode == "default" else mode)
            self._prefill, self._step = compile_(self._prefill_fn), compile_(self._step_fn)

    def _prefill_fn(self, ids: torch.Tensor, cache: list) -> torch.Tensor:
        return self.model(ids, cache=cache)[0].argmax(-1)  # (P,) every position's next token

    def _step_fn(self, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.model(token[:, None], cache=self.cache, pos=pos)[:, -1].argmax(-1)

    def prefill(self, slot: int, prompt_len: int) -> float:
        padded = min(b for b in self.buckets if b >= prompt_len)
        view = [(k[slot:slot + 1], v[slot:slot + 1]) for k, v in self.cache]
        with _context(self.device, self.amp):
            token = self._prefill(self._ids[:, :padded], view)[prompt_len - 1]
            self.token[slot] = token
            self.pos[slot, 0] = prompt_len
        self.last[slot] = int(token.item())  # waits for the device
        return time.perf_counter()

    def step(self, slots: Sequence[int]) -> float:
        with _context(self.device, self.amp):
            out = self._step(self.token, self.pos)
            self.token.copy_(out)
            self.pos[list(slots)] += 1
        self.last = out.cpu().numpy()  # waits for the device
        return time.perf_counter()


def prepare_slots(backend: TorchBackend, slots: int, prompt_buckets: Sequence[int],
                  longest: int) -> TorchSlots:
    return TorchSlots(backend, slots, prompt_buckets, longest)
