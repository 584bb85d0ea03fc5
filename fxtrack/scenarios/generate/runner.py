"""The generate scenario: greedy decoding with a KV cache, what serving an LM costs. Each timed
step of the one timer is one generation of ``batch_size`` sequences (prefill of
``scenario.prompt_len`` prompt tokens, then ``scenario.new_tokens - 1`` decode steps); inside
it, the time to the first token and every decode step are read with the same clock, each ended
by waiting for the device (a server streams every token as it comes)."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from fxtrack import families, flops

from fxtrack.families.text import progressions
from fxtrack.frameworks.base import Backend
from fxtrack.frameworks.declaration import NotSupported
from fxtrack.worker.protocol import Result
from fxtrack.measure.timer import percentile
from fxtrack.scenarios.registry import options_of
from fxtrack.scenarios.timed import param_guard, run_timed


def prompts(backend: Backend, batch: int, prompt_len: int) -> np.ndarray:
    """The same prompts in every framework: learnable progressions from the run's seed."""
    rng = np.random.default_rng(backend.spec.seed)
    return progressions(rng, batch, prompt_len, backend.arch.vocab_size).astype(np.int32)


def run(backend: Backend, result: Result) -> None:
    arch, options = backend.arch, options_of(backend.spec)
    if not families.of(arch).generates:  # the rules refuse it before any work; a backstop
        raise NotSupported(f"scenario=generate needs a decoder LM (model=llama), not {arch.name}")
    prompt_len, new_tokens = options.prompt_len, options.new_tokens
    ttft_s: list[float] = []  # one per generation, warm-up included
    decode_s: list[list[float]] = []  # per generation: each decode step
    generated: list[np.ndarray] = []
    state: dict[str, Any] = {}

    def prepare() -> Callable[[], Any]:
        batch = result.resolved["batch_size"]
        decoder = backend.capability("generate").prepare(backend, prompt_len, new_tokens)
        state.update(decoder=decoder, prompt=prompts(backend, batch, prompt_len))

        def generation() -> None:
            start = time.perf_counter()
            token = decoder.prefill(state["prompt"])
            out = [decoder.tokens(token)]
            ttft_s.append(time.perf_counter() - start)
            steps = []
            for _ in range(new_tokens - 1):
                t = time.perf_counter()
                token = decoder.step(token)
                out.append(decoder.tokens(token))
                steps.append(time.perf_counter() - t)
            decode_s.append(steps)
            generated.append(np.stack(out, axis=1))

        return generation

    run_timed(backend, result, prepare,
              flops.generate_flops_per_sample(arch, prompt_len, new_tokens))
    decoder, warmup = state["decoder"], result.resolved["warmup_steps"]
    result.metrics.update(generation_metrics(ttft_s[warmup:], decode_s[warmup:],
                                             result.resolved["batch_size"]))
    result.metrics["kv_cache_mib"] = decoder.cache_bytes() / 2**20
    result.metrics["tokens_per_s"] = result.metrics["throughput_samples_per_s"] * new_tokens
    result.tags.update(prompt_len=str(prompt_len), new_tokens=str(new_tokens))
    result.series["decode_ms_per_token"] = [t * 1e3 for t in decode_s[-1]]
    result.guard = cache_guard(generated[-1], decoder.uncached(state["prompt"], new_tokens))
    if result.guard == "ok" and (generated[-1] == state["prompt"][:, -1:]).all():
        # An untrained model's tied embedding dominates its logits: it repeats the prompt's last
        # token, and equal tokens then prove little about the cache (the parity tests use
        # weights that make the tokens depend on the context).
        result.tags["generate_guard"] = "weak: every sequence repeats its prompt's last token"
    if result.guard == "ok":
        result.guard = param_guard(arch, int(result.metrics["param_count"]))


def generation_metrics(ttft_s: list[float], decode_s: list[list[float]], batch: int
                       ) -> dict[str, float]:
    """The timed generations' figures: time to first token (the prompt's copy to the device, its
    prefill and the first argmax), each decode
    step's latency, and decode throughput = batch x (new_tokens - 1) tokens / decode time (the
    tokens after the first, over the time the decode steps took)."""
    ttft = [t * 1e3 for t in ttft_s]
    steps = [t * 1e3 for g in decode_s for t in g]
    out = {"ttft_ms_p50": percentile(ttft, 50), "ttft_ms_p90": percentile(ttft, 90)}
    if steps:  # new_tokens=1: the prefill's token only
        out.update(decode_ms_per_token_p50=percentile(steps, 50),
                   decode_ms_per_token_p90=percentile(steps, 90),
                   decode_tokens_per_s=batch * len(steps) / (sum(steps) / 1e3))
    return out


def cache_guard(cached: np.ndarray, uncached: np.ndarray) -> str:
    """The correctness guard: the cached decode gave exactly the uncached greedy tokens."""
    if cached.shape != uncached.shape:
        return f"cached decode gave shape {cached.shape}, uncached {uncached.shape}"
    differs = np.nonzero((cached != uncached).any(axis=0))[0]
    if differs.size:
        return (f"cached decode differs from the uncached forward from token {int(differs[0])} "
                f"({int((cached != uncached).sum())} of {cached.size} tokens)")
    return "ok"
