"""scenario=generate for PyTorch (fxtrack.frameworks.decoding.Decoder): greedy decoding of the
built Llama through a static KV cache, the training model's own forward with a cache argument.

The cache is preallocated once per layer as (B, kv_heads, prompt_len + new_tokens, hd) K and V
tensors in the run's compute dtype; a prefill writes positions [0, prompt_len), each decode step
writes its one position in place (``index_copy_`` at a device-side position) and attends over
the whole cache under a mask. Shapes never change, so ``torch.compile`` (the compile rule: GPU)
traces the step once; on a CPU it runs eager."""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np
import torch

from fxtrack.frameworks.torch import FRAMEWORK, devices, train

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.torch.backend import TorchBackend


class TorchDecoder:
    def __init__(self, backend, prompt_len: int, new_tokens: int) -> None:
        self.model, self.device = backend.model, backend.device
        self.prompt_len = prompt_len
        self.amp = train.AMP_DTYPES[backend.spec.precision]
        self.model.eval()
        arch, batch = backend.arch, backend.batch["input_ids"].shape[0]  # build()'s batch
        shape = (batch, arch.kv_heads, prompt_len + new_tokens, arch.hidden // arch.heads)
        dtype = self.amp or torch.float32
        self.cache = [(torch.zeros(shape, dtype=dtype, device=self.device),
                       torch.zeros(shape, dtype=dtype, device=self.device))
                      for _ in range(arch.layers)]
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)
        self._prefill: Callable[..., torch.Tensor] = self._prefill_fn
        self._step: Callable[..., torch.Tensor] = self._step_fn
        if backend.spec.compile:
            mode = FRAMEWORK.setting(backend.spec, "compile_mode")
            compile_ = functools.partial(torch.compile, mode=None if mode == "default" else mode,
                                         fullgraph=True)
            self._prefill, self._step = compile_(self._prefill_fn), compile_(self._step_fn)

    def _context(self) -> contextlib.AbstractContextManager:
        return _context(self.device, self.amp)

    def _prefill_fn(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids, cache=self.cache)[:, -1].argmax(-1)

    def _step_fn(self, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.model(token[:, None], cache=self.cache, pos=pos)[:, -1].argmax(-1)

    def prefill(self, prompt: np.ndarray) -> torch.Tensor:
        ids = torch.from_numpy(np.ascontiguousarray(prompt)).to(self.device).long()
        with self._context():
            token = self._prefill(ids)
            self.pos.fill_(self.prompt_len)  # the next token's position
        return token

    def step(self, token: torch.Tensor) -> torch.Tensor:
        with self._context():
            out = self._step(token, self.pos)
            self.pos += 1
        return out

    def tokens(self, token: torch.Tensor) -> np.ndarray:
        return token.cpu().numpy()  # waits for the device

    def cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for kv in self.cache for t in kv)

    def uncached(self, prompt: np.ndarray, new_tokens: int) -> np.ndarray:
        """Full forward over the whole sequence at every step, eager, no cache."""
        seq = torch.from_numpy(np.ascontiguousarray(prompt)).to(self.device).long()
        out = []
        with self._context():
            for _ in range(new_tokens):
                token = self.model(seq)[:, -1].argmax(-1)
                out.append(token)
                seq = torch.cat([seq, token[:, None]], dim=1)
        devices.sync(self.device)
        return torch.stack(out, dim=1).cpu().numpy()


@contextlib.contextmanager
def _context(device: torch.device, amp: Any) -> Iterator[None]:
    """inference_mode (no autograd state) and the run's autocast, as scenario=inference uses."""
    with torch.inference_mode(), torch.autocast(device.type, dtype=amp or torch.float32,
                                                enabled=amp is not None):
        yield


def prepare(backend: TorchBackend, prompt_len: int, new_tokens: int) -> TorchDecoder:
    return TorchDecoder(backend, prompt_len, new_tokens)
