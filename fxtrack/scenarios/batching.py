"""scenario=serve's request lengths, continuous batching and tail-size rule (issue 45):
framework-free, tested with a fake decoder of fixed per-step time on a virtual clock.

Continuous batching (``scenario.batching=continuous``), as the iteration-level schedulers of
the LLM engines do: ``max_batch`` KV-cache slots; at each decode step every waiting request that
has arrived takes a free slot and is prefilled whole at admission (its first token), then the
step decodes one token for every occupied slot; a request whose last token is out frees its slot
at once, so the next step may admit a waiting one. A request that waited past ``timeout_ms``
before admission is dropped (failed, ``timeout``); one whose prefill or step raised is failed
(``error``), never lost.
"""

from __future__ import annotations

import functools
import math
import re
import time
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

import numpy as np


# A drawn length is clipped to this many times its mean: the compiled shapes (the KV cache's
# positions) are sized for the longest, so an unbounded lognormal tail would size them all.
LENGTH_CAP_FACTOR = 4
DRAWN = ("fixed", "uniform", "lognormal")  # scenario.length_dist's drawn here, one at a time


def draw_lengths(n: int, mean: int, dist: str, sigma: float, seed: int) -> list[int]:
    """``n`` seeded lengths of mean ``mean`` (at least 1, at most LENGTH_CAP_FACTOR * mean):
    ``fixed``: all ``mean``; ``uniform``: integers in mean +- round(sigma * mean);
    ``lognormal``: exp(N(mu, sigma)), mu set so that the clipped draw's mean is ``mean`` (the
    clip alone would lower it: by 7% at sigma 1)."""
    if dist not in DRAWN:  # dataset: drawn in pairs, below
        raise ValueError(f"draw_lengths draws fixed|uniform|lognormal lengths, got {dist!r}")
    if dist == "fixed" or sigma == 0:
        return [int(mean)] * n
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        half = int(round(sigma * mean))
        drawn = rng.integers(mean - half, mean + half + 1, n)
    else:
        drawn = np.rint(rng.lognormal(_clipped_mu(mean, sigma), sigma, n))
    return [int(x) for x in np.clip(drawn, 1, LENGTH_CAP_FACTOR * mean)]


def _clipped_mu(mean: float, sigma: float) -> float:
    """The mu whose lognormal, clipped at LENGTH_CAP_FACTOR * mean, has mean ``mean``:
    E[min(X, c)] = e^(mu + sigma^2/2) Phi((ln c - mu - sigma^2)/sigma) + c (1 - Phi((ln c - mu)
    /sigma)) rises with mu from 0 to c, so a bisection finds it."""
    cap = math.log(LENGTH_CAP_FACTOR * mean)

    def phi(x: float) -> float:
        return 0.5 * (1 + math.erf(x / math.sqrt(2)))

    def clipped_mean(mu: float) -> float:
        return (math.exp(mu + sigma ** 2 / 2) * phi((cap - mu - sigma ** 2) / sigma)
                + math.exp(cap) * (1 - phi((cap - mu) / sigma)))

    lo, hi = math.log(mean) - sigma ** 2 / 2 - 1, cap
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if clipped_mean(mid) < mean else (lo, mid)
    return (lo + hi) / 2


def request_lengths(n: int, prompt_mean: int, output_mean: int, dist: str, sigma: float,
                    seed: int, source: Optional[str] = None) -> tuple[list[int], list[int]]:
    """Each of ``n`` requests' (prompt lengths, output lengths), seeded: from ``dist``
    (draw_lengths, the two drawn apart) or, for ``dataset``, pairs drawn from ``source``
    (dataset_lengths: a prompt and its output together)."""
    if dist == "dataset":
        return dataset_lengths(n, prompt_mean, output_mean, source or "", seed)
    return (draw_lengths(n, prompt_mean, dist, sigma, seed + 2),
            draw_lengths(n, output_mean, dist, sigma, seed + 1))


PYCODE = "pycode"  # scenario.length_data: fxtrack.data's corpus of the stdlib's sources
# a record of a corpus ends at a blank line (a paragraph; in code, a block between blank lines)
RECORD_BREAK = re.compile(rb"\n[ \t\r\f\v]*\n\s*")


@functools.lru_cache(maxsize=4)
def dataset_pairs(source: str) -> np.ndarray:
    """(prompt, output) lengths in bytes (the byte-level vocabulary's tokens) of a corpus:
    ``pycode`` or a UTF-8 text file, cut into records at blank lines, each record paired with
    the next one (records 0 and 1, 2 and 3, ...): the prompt a block, its output the block
    that follows. ValueError, one line, for a corpus that cannot give two records."""
    if source == PYCODE:
        from fxtrack import data

        split = data.load({"name": PYCODE})
        text = bytes(np.concatenate([split.x_train, split.x_held]))
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise ValueError(f"scenario.length_data {source!r} is neither {PYCODE} nor a "
                             "readable text file")
        try:
            text = path.read_bytes()
            text.decode("utf-8")
        except OSError as e:
            raise ValueError(f"scenario.length_data {source!r} could not be read: "
                             f"{type(e).__name__}") from None
        except UnicodeDecodeError as e:
            raise ValueError(f"scenario.length_data {source!r} is not UTF-8 text (byte "
                             f"{e.start})") from None
    records = [len(r.rstrip()) for r in RECORD_BREAK.split(text) if r.strip()]
    if len(records) < 2:
        raise ValueError(f"scenario.length_data {source!r} holds {len(records)} record(s) "
                         "separated by blank lines; a prompt and its output need at least 2")
    pairs = len(records) // 2
    return np.array(records[:2 * pairs]).reshape(pairs, 2)


def length_data_refusal(length_dist: str, length_data: Optional[str]) -> Optional[str]:
    """Why scenario.length_data cannot give lengths (dataset_pairs' line), read and cut once
    before any work; None when it can or is not read."""
    if length_dist != "dataset":
        return None
    try:
        dataset_pairs(str(length_data))
    except ValueError as e:
        return str(e)
    return None


def dataset_lengths(n: int, prompt_mean: int, output_mean: int, source: str,
                    seed: int) -> tuple[list[int], list[int]]:
    """``n`` (prompt, output) pairs drawn with replacement from ``source``'s pairs (seeded),
    each column scaled so that its clipped draw has the requested mean: a corpus gives the
    shape of the lengths (their spread, a long prompt's long output), the options their size,
    which the compiled shapes and the device must hold. Clipped as draw_lengths' are."""
    pairs = dataset_pairs(source)
    rows = np.random.default_rng(seed).integers(0, len(pairs), n)
    return (_scaled(pairs[:, 0], prompt_mean)[rows].tolist(),
            _scaled(pairs[:, 1], output_mean)[rows].tolist())


def _scaled(lengths: np.ndarray, mean: int) -> np.ndarray:
    """``lengths`` times the factor whose rounded, clipped ([1, LENGTH_CAP_FACTOR * mean])
    values have mean ``mean``: the clipped mean rises with the factor, so a bisection finds it."""
    cap = LENGTH_CAP_FACTOR * mean

    def at(factor: float) -> np.ndarray:
        return np.clip(np.rint(lengths * factor), 1, cap).astype(int)

    lo, hi = 0.0, cap / max(float(lengths.min()), 1.0)  # hi: every length at the cap
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if at(mid).mean() < mean else (lo, mid)
    return at(hi)


PROMPT_BUCKET_FLOOR = 16  # the smallest padded prompt length compiled


def prompt_buckets(longest: int) -> list[int]:
    """The padded prompt lengths a slot's prefill is compiled for: powers of two from
    PROMPT_BUCKET_FLOOR below ``longest``, then ``longest``: log2 shapes, padding under 2x."""
    out, size = [], PROMPT_BUCKET_FLOOR
    while size < longest:
        out.append(size)
        size *= 2
    return out + [longest]


def bucket_for(size: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``size``."""
    return min(b for b in buckets if b >= size)


def min_queries_for(percentile: float, confidence: float = 0.99) -> int:
    """The fewest requests behind a ``percentile`` (e.g. 99) for MLPerf Inference's
    early-stopping rule to accept it at ``confidence`` when none exceeded it: the least n with
    P(no request above the percentile | n requests) = (percentile/100)^n <= 1 - confidence.
    Derived from the binomial bound of mlcommons/inference loadgen/early_stopping.cc
    (MinPassingQueriesFinder with t = 0 overlatency queries, tolerance d = 0); p99 at 99%: 459."""
    p = percentile / 100.0
    return int(math.ceil(math.log(1 - confidence) / math.log(p) - 1e-9))


def undersized(have: int, percentile: float) -> bool:
    """Whether ``have`` samples are too few behind ``percentile`` for the early-stopping rule
    (min_queries_for): the one test serve's requests and inference's batches are put to."""
    return have < min_queries_for(percentile)


class SlotDecoder(Protocol):
    """A framework's decoder seen per KV-cache slot: ``prefill`` one request's prompt of
    ``prompt_len`` tokens into ``slot`` (its first token out), ``step`` one token for each of
    ``slots``; each returns ``clock()`` read after waiting for the device. ``ids`` (host, (1,
    longest prompt bucket)) is the seeded prompt a request of n tokens reads the first n of;
    ``last`` each slot's latest token, read back: the window records them for the output check."""

    ids: np.ndarray
    last: np.ndarray

    def prefill(self, slot: int, prompt_len: int) -> float: ...

    def step(self, slots: Sequence[int]) -> float: ...


class Pending(Protocol):
    """What the scheduler reads and writes on a request (serve.Request)."""

    arrival_s: float
    prompt_len: int
    new_tokens: int
    start_s: float
    token_s: list[float]
    failed: str
    batch_id: int
    bucket: int
    output_ids: list[int]


def continuous_window(decoder: SlotDecoder, requests: Sequence[Pending], *, max_batch: int,
                      timeout_ms: Optional[float] = None,
                      clock: Callable[[], float] = time.perf_counter,
                      sleep: Callable[[float], None] = time.sleep) -> None:
    """Serve ``requests`` (sorted by arrival, times in s from the window's start) with
    ``max_batch`` slots, filling in each record's admission, token times and failure."""
    t0 = clock()
    # the tokens each slot was served, read back for the output check after the window
    def last(slot: int) -> int:
        return int(decoder.last[slot])
    free = list(range(max_batch))
    active: dict[int, Pending] = {}  # slot -> its request
    waiting = 0  # requests[:waiting] were admitted or dropped
    steps = 0

    def finish(slot: int) -> None:
        del active[slot]
        free.append(slot)

    while waiting < len(requests) or active:
        now = clock() - t0
        # admission at this step: every arrived request while a slot is free, oldest first
        while waiting < len(requests) and requests[waiting].arrival_s <= now:
            r = requests[waiting]
            if timeout_ms is not None and (now - r.arrival_s) * 1e3 > timeout_ms:
                r.failed, waiting = "timeout", waiting + 1
                continue
            if not free:
                break
            slot = free.pop(0)
            r.start_s, r.batch_id, r.bucket = now, steps, max_batch
            waiting += 1
            try:
                r.token_s.append(decoder.prefill(slot, r.prompt_len) - t0)
                r.output_ids.append(last(slot))
            except Exception as e:  # noqa: BLE001 - a failed request is counted, not lost
                r.failed = f"error: {type(e).__name__}"
                free.append(slot)
                continue
            active[slot] = r
            if r.new_tokens <= 1:
                finish(slot)
            now = clock() - t0
        if not active:
            if waiting < len(requests):  # idle until the next arrival
                sleep(max(requests[waiting].arrival_s - (clock() - t0), 0.0))
            continue
        slots = sorted(active)
        try:
            t = decoder.step(slots) - t0
        except Exception as e:  # noqa: BLE001 - every request in the step failed, none lost
            for slot in slots:
                active[slot].failed = f"error: {type(e).__name__}"
                finish(slot)
            continue
        steps += 1
        for slot in slots:
            r = active[slot]
            r.token_s.append(t)
            r.output_ids.append(last(slot))
            if len(r.token_s) >= r.new_tokens:
                finish(slot)
