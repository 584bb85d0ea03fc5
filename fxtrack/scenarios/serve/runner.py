"""The serve scenario: requests arriving at a rate, one batching policy for every framework,
per-request latency and goodput under SLOs (issue 32).

Framework-free: the arrival process, the queue, the batcher and the per-request figures live
here and are tested with a fake server whose service time is fixed. A framework supplies only
its compiled step: the ``generate`` capability's Decoder (model=llama: batched prefill, then
decode through the KV cache, i.e. static batching: a batch's requests start and end together)
or the ``inference`` capability's forward step (one "token": the whole response).

Timing: one clock (``time.perf_counter``) for arrivals, starts, tokens and ends; each token time
is read after ``decoder.tokens`` (the device is waited on). Open loop: the arrival times are
drawn ahead from a seeded gamma process (shape ``burstiness``, 1 = Poisson) and the requests
join the queue when their time comes, whatever the server is doing (a request that arrived
while a batch ran waits in the queue: its latency counts from its arrival). Closed loop
(``concurrency`` = C): C clients, each sending its next request when its last one ended.

Correct outputs (issue 62): after each window, outside its timing, every completed request's
tokens are compared with its prompt decoded alone (batch 1, greedy, no cache, the run's
precision: the generate capability's ``uncached``); a sample of prompts when a window holds many
different ones (MAX_REFERENCE_PROMPTS), counted in ``serve_output_checked_requests``.

The batcher: when the queue holds a request, wait until ``max_batch`` have arrived or the
oldest has waited ``max_wait_ms``, then serve up to ``max_batch`` at once, padded to the
smallest bucket of ``batch_buckets`` that holds them (every bucket compiled in the warm-up).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from fxtrack import families
from fxtrack.worker.protocol import append_child
from fxtrack.measure.timer import eprint, percentile
from fxtrack.scenarios.batching import (bucket_for, continuous_window, length_data_refusal,
                                        min_queries_for, prompt_buckets, request_lengths,
                                        undersized)
from fxtrack.search import bracket_search
from fxtrack.scenarios import accuracy
from fxtrack.scenarios.options import from_json
from fxtrack.scenarios.serve import ServeOptions

RATE_SHORT_FRACTION = 0.05  # achieved arrival rate this far below the requested: tagged
# A probe of the rate search fails, whatever its SLOs, when requests are admitted this much
# slower than they arrive: the queue grows without bound (the server is saturated). Without it a
# TPOT-only SLO never fails under static batching: queueing delays the first token, not the
# gaps between tokens (docs/serving.md#the-rate-search).
SATURATED_FRACTION = 0.10
MAX_TIMED_REQUESTS = 100_000  # scenario.duration_s: the most requests one window may hold
FAILED_FRACTION = 0.01  # a probe with more of its requests failed fails (no p99 of them holds)
# scenario.sized_tail with rate=search: the passing rates confirmed at full size, highest first,
# before the search gives up (each costs sized_requests() / rate seconds)
MAX_CONFIRMATIONS = 3
# the most distinct prompts a run decodes alone for the output check (each is a batch-1 decode
# of the longest output, no cache): beyond it a request whose prompt has no reference yet is
# left unchecked and the count of checked requests says so
MAX_REFERENCE_PROMPTS = 32


@dataclasses.dataclass
class Request:
    """One request's record, every time on the one clock, in seconds from the window's start."""

    id: int
    arrival_s: float
    new_tokens: int = 1
    start_s: float = math.nan  # admitted: its batch began, or (continuous) its prefill
    token_s: list[float] = dataclasses.field(default_factory=list)  # each output token's time
    batch_id: int = -1
    bucket: int = 0
    prompt_len: int = 0  # language models: its prompt's tokens (0: not a language model)
    failed: str = ""  # "timeout" (waited past scenario.timeout_ms) or "error: <exception>"
    batch_row: int = -1  # static batching: its row of its bucket's batch (its prompt)
    output_ids: list[int] = dataclasses.field(default_factory=list)  # the tokens it was served
    checked: bool = False  # its tokens were compared with its prompt decoded alone
    first_mismatch: Optional[int] = None  # the first position where they differed

    @property
    def completed(self) -> bool:
        return not self.failed and len(self.token_s) >= self.new_tokens

    def queue_ms(self) -> float:
        """Arrival to admission: waiting, not working."""
        return (self.start_s - self.arrival_s) * 1e3

    def service_ms(self) -> float:
        """Admission to last token: working."""
        return (self.end_s - self.start_s) * 1e3

    @property
    def end_s(self) -> float:
        return self.token_s[-1]

    @property
    def first_token_s(self) -> float:
        return self.token_s[0]

    def ttft_ms(self) -> float:
        return (self.first_token_s - self.arrival_s) * 1e3

    def e2e_ms(self) -> float:
        return (self.end_s - self.arrival_s) * 1e3

    def tpot_ms(self) -> Optional[float]:
        """(E2E - TTFT) / (tokens - 1); None for one token."""
        n = len(self.token_s)
        return (self.end_s - self.first_token_s) * 1e3 / (n - 1) if n > 1 else None

    def itl_ms(self) -> list[float]:
        return [(b - a) * 1e3 for a, b in zip(self.token_s, self.token_s[1:])]

    def row(self) -> dict[str, Any]:
        """The artifact's row: enough to recompute any figure."""
        done = bool(self.token_s)
        return {"id": self.id, "arrival_s": self.arrival_s, "start_s": self.start_s,
                "first_token_s": self.first_token_s if done else None,
                "end_s": self.end_s if done else None, "prompt_len": self.prompt_len,
                "new_tokens": self.new_tokens, "tokens": len(self.token_s),
                "batch_id": self.batch_id, "bucket": self.bucket, "failed": self.failed,
                "token_s": self.token_s, "checked": self.checked,
                "first_mismatch": self.first_mismatch}


class Server(Protocol):
    """A framework's compiled step seen by the batcher: serve ``len(new_tokens)`` requests padded
    to ``bucket``, decoding ``max(new_tokens)`` tokens; return each token's completion time
    (``clock()`` read after waiting for the device), in order. A server that decodes tokens
    (decoder_server) also holds ``outputs``: the last call's token ids, (bucket, tokens)."""

    def __call__(self, bucket: int, new_tokens: Sequence[int]) -> list[float]: ...


def arrival_gaps(rate: float, n: int, burstiness: float, seed: int) -> np.ndarray:
    """``n`` gaps (s) of a gamma process of mean rate ``rate`` per second: shape ``burstiness``
    (1 = exponential gaps: Poisson; below 1 burstier), mean 1/rate."""
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"need rate > 0 and burstiness > 0, got {rate} and {burstiness}")
    rng = np.random.default_rng(seed)
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)


def arrivals_within(rate: float, burstiness: float, seed: int, duration_s: float) -> np.ndarray:
    """The arrival times (s from the first) of the seeded gamma process that fall inside
    ``duration_s``: the window of ``scenario.duration_s`` (the first arrival opens it)."""
    n = int(rate * duration_s * 1.5) + 16
    while True:
        gaps = arrival_gaps(rate, n, burstiness, seed)
        times = np.concatenate([[0.0], np.cumsum(gaps[1:])])
        if times[-1] > duration_s or n >= MAX_TIMED_REQUESTS:
            return times[times <= duration_s][:MAX_TIMED_REQUESTS]
        n *= 2


def serve_window(server: Server, *, max_batch: int, max_wait_ms: float, buckets: Sequence[int],
                 tokens: Sequence[int], arrivals_s: Optional[Sequence[float]] = None,
                 concurrency: Optional[int] = None, duration_s: Optional[float] = None,
                 prompt_lens: Optional[Sequence[int]] = None, timeout_ms: Optional[float] = None,
                 clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep) -> list[Request]:
    """Serve ``len(tokens)`` requests: open loop at ``arrivals_s`` (s from the start), or closed
    loop with ``concurrency`` clients (with ``duration_s``: a client sends no request after
    that time, at most ``len(tokens)``). A request that waited past ``timeout_ms`` when its
    batch forms is dropped (``failed="timeout"``); a batch whose server call raised is failed
    (``error``). Returns every record, failed ones included, times from the window's start."""
    if (arrivals_s is None) == (concurrency is None):
        raise ValueError("give arrival times (open loop) or a concurrency (closed loop)")
    n = len(tokens)
    lens = list(prompt_lens) if prompt_lens is not None else [0] * n
    t0 = clock()
    if arrivals_s is not None:
        requests = [Request(i, float(a), int(k), prompt_len=int(lens[i]))
                    for i, (a, k) in enumerate(zip(arrivals_s, tokens))]
    else:
        requests = [Request(i, 0.0, int(tokens[i]), prompt_len=int(lens[i]))
                    for i in range(min(concurrency, n))]
    served = 0  # requests[:served] have been served or dropped
    batch_id = 0
    while served < n:
        now = clock() - t0
        head = requests[served]
        if head.arrival_s > now:  # nothing queued: idle until the next arrival
            sleep(head.arrival_s - now)
            continue
        # the batch closes when max_batch have arrived or the oldest has waited max_wait_ms
        last = min(served + max_batch, len(requests)) - 1
        close = min(head.arrival_s + max_wait_ms / 1e3,
                    requests[last].arrival_s if last - served + 1 == max_batch else math.inf)
        if close > now:
            sleep(close - now)
            now = clock() - t0
        taken = [r for r in requests[served:served + max_batch] if r.arrival_s <= now]
        for r in taken:
            if timeout_ms is not None and (now - r.arrival_s) * 1e3 > timeout_ms:
                r.failed = "timeout"
        batch = [r for r in taken if not r.failed]
        if batch:
            bucket = bucket_for(len(batch), buckets)
            for r in batch:
                r.start_s, r.batch_id, r.bucket = now, batch_id, bucket
            try:
                times = [t - t0 for t in server(bucket, [r.new_tokens for r in batch])]
            except Exception as e:  # noqa: BLE001 - a failed batch is counted, not lost
                times = []
                for r in batch:
                    r.failed = f"error: {type(e).__name__}"
            ids = getattr(server, "outputs", None) if times else None
            for row, r in enumerate(batch):
                r.token_s, r.batch_row = times[:r.new_tokens], row
                if ids is not None:
                    r.output_ids = [int(t) for t in ids[row, :r.new_tokens]]
            batch_id += 1
        served += len(taken)
        if concurrency is not None:  # each finished client sends its next request
            for r in taken:
                done = r.end_s if r.token_s else clock() - t0
                if len(requests) < n and (duration_s is None or done < duration_s):
                    i = len(requests)
                    requests.append(Request(i, done, int(tokens[i]), prompt_len=int(lens[i])))
            if len(requests) == served:  # every client is past duration_s: the window is over
                break
    return requests[:served]


def meets(r: Request, slo: dict[str, Optional[float]]) -> bool:
    """Whether ``r`` completed and meets every SLO that is set (None: not set)."""
    if not r.completed:
        return False
    figures = {"ttft_ms": r.ttft_ms(), "tpot_ms": r.tpot_ms(), "e2e_ms": r.e2e_ms()}
    return all(figures[k] is None or figures[k] <= v for k, v in slo.items() if v is not None)


def request_metrics(requests: list[Request], slo: dict[str, Optional[float]], lm: bool,
                    rate: Optional[float]) -> dict[str, float]:
    """The window's figures from the per-request records alone (so the artifact recomputes
    them): p50/p90/p99 of E2E, queue and service time (and for an LM of TTFT, TPOT, ITL) over
    the completed requests, with their number and the failed ones' beside them; request and
    token throughput, goodput (completed requests meeting every SLO), the achieved arrival
    rate. TPOT is per output token after the first, so it holds for any length."""
    done = [r for r in requests if r.completed]
    start = min(r.arrival_s for r in requests)
    stop = max([r.end_s for r in done] + [r.arrival_s for r in requests])
    span = max(stop - start, 1e-9)
    out: dict[str, float] = {}
    series = {"e2e": [r.e2e_ms() for r in done], "queue": [r.queue_ms() for r in done],
              "service": [r.service_ms() for r in done]}
    if lm:
        series.update(ttft=[r.ttft_ms() for r in done],
                      tpot=[t for r in done if (t := r.tpot_ms()) is not None],
                      itl=[t for r in done for t in r.itl_ms()])
    for name, values in series.items():
        for q in (50, 90, 99):
            if values:
                out[f"serve_{name}_ms_p{q}"] = percentile(values, q)
    out["serve_requests"] = float(len(requests))
    out["serve_percentile_requests"] = float(len(done))  # the requests behind each percentile
    out["failed_requests"] = float(len(requests) - len(done))
    out["timed_out_requests"] = float(sum(r.failed == "timeout" for r in requests))
    out["request_throughput_rps"] = len(done) / span
    out["output_tokens_per_s"] = sum(len(r.token_s) for r in done) / span
    good = sum(meets(r, slo) for r in requests)
    out["goodput_rps"] = good / span
    out["slo_attained_fraction"] = good / len(requests)  # a failed request missed its SLOs
    arrivals = sorted(r.arrival_s for r in requests)
    if rate is not None and len(arrivals) > 1:
        out["requested_rate_rps"] = float(rate)
        out["achieved_rate_rps"] = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    ends = sorted(r.end_s for r in done)
    if len(ends) > 1 and ends[-1] > ends[0]:  # all in one batch: no rate to tell
        out["completion_rate_rps"] = (len(ends) - 1) / (ends[-1] - ends[0])
    if "achieved_rate_rps" in out:
        admitted = admission_rate(requests, out["achieved_rate_rps"])
        if admitted is not None:
            out["admission_rate_rps"] = admitted
    out["batches"] = float(len({r.batch_id for r in done}))
    if done:
        out["mean_batch_size"] = len(done) / out["batches"]
    return out


def tail_tags(figures: dict[str, float], percentile_q: float = 99) -> dict[str, str]:
    """The p99's sample size against MLPerf Inference's early-stopping minimum (99%
    confidence, batching.min_queries_for): tagged ``serve_p99_undersized`` when fewer."""
    need = min_queries_for(percentile_q)
    have = int(figures.get("serve_percentile_requests", 0))
    return {"serve_p99_min_requests": str(need),
            "serve_p99_undersized": "true" if undersized(have, percentile_q) else "false"}


def sized_requests(percentile_q: float = 99) -> int:
    """A window's requests for scenario.sized_tail: the early-stopping minimum behind the
    percentile, with room for the failures a passing probe may have (FAILED_FRACTION)."""
    return math.ceil(min_queries_for(percentile_q) / (1 - FAILED_FRACTION))


def confirm_rates(passing: Sequence[float], probe: Callable[[float], bool],
                  limit: int = MAX_CONFIRMATIONS) -> tuple[Optional[float], list[float]]:
    """scenario.sized_tail after a search of small probes: serve a full-sized window
    (``probe``) at the passing rates, highest first, until one passes; at most ``limit`` of
    them. Returns the confirmed rate (None: none within the limit) and those that failed."""
    failed: list[float] = []
    for rate in sorted(set(passing), reverse=True)[:limit]:
        if probe(rate):
            return rate, failed
        failed.append(rate)
    return None, failed


def slo_passes(metrics: dict[str, float], slo: dict[str, Optional[float]]) -> bool:
    """A probe passes when the p99 of every SLO that is set meets it."""
    return all(metrics.get(f"serve_{k}_p99", math.inf) <= v for k, v in slo.items()
               if v is not None)


def admission_rate(requests: Sequence[Request], arrival_rate: float) -> Optional[float]:
    """How fast the queue was drained: ``arrival_rate`` / the least-squares slope of each
    admitted request's admission time against its arrival time. A server that keeps up admits
    each request a bounded wait after it arrives (slope 1, whatever its service times); one that
    does not admits at its capacity C while requests arrive at R (slope R / C, so this gives C).
    A fit over every request, not the span's two ends: one long request in flight at the end
    (lognormal lengths) moves an end, not the slope. None without two distinct arrivals."""
    admitted = [r for r in requests if math.isfinite(r.start_s)]
    if len(admitted) < 2:
        return None
    a = np.array([r.arrival_s for r in admitted])
    s = np.array([r.start_s for r in admitted])
    spread = float(((a - a.mean()) ** 2).sum())
    if spread <= 0:
        return None
    slope = float(((a - a.mean()) * (s - s.mean())).sum()) / spread
    return arrival_rate / slope if slope > 0 else None


def saturated(metrics: dict[str, float]) -> bool:
    """Requests were admitted more than SATURATED_FRACTION slower than they arrived: the queue
    grew through the window, so the rate is past what the server sustains. Admissions, not
    completions: the completions' span also holds the spread of the service times (lognormal
    lengths over a short window stretch it however fast the server keeps up)."""
    took, came = metrics.get("admission_rate_rps"), metrics.get("achieved_rate_rps")
    return took is not None and came is not None and took < (1 - SATURATED_FRACTION) * came


def probe_verdict(metrics: dict[str, float], slo: dict[str, Optional[float]]) -> str:
    """A rate-search probe: ``pass``, ``failed`` (more than 1% of its requests failed: no p99
    of them can meet an SLO), ``slo`` (a p99 missed its SLO) or ``saturated``."""
    if metrics.get("failed_requests", 0) > FAILED_FRACTION * metrics.get("serve_requests", 1):
        return "failed"
    if not slo_passes(metrics, slo):
        return "slo"
    return "saturated" if saturated(metrics) else "pass"


@dataclasses.dataclass
class SearchResult:
    max_rate_rps: float  # the highest passing rate (0: none passed)
    lowest_failing_rps: float  # inf: none failed up to max_rate
    probes: list[tuple[float, bool]]


def search_rate(passes: Callable[[float], bool], start: float, resolution: float,
                max_rate: float = 1e6) -> SearchResult:
    """Double the rate from ``start`` until a probe fails, then bisect the bracket until it is
    narrower than ``resolution`` (relative: 0.1 = 10% of the passing rate)."""
    # fxtrack.search's one bracket search; halving stops at start/16, as each low-rate probe
    # takes num_requests / rate seconds
    found = bracket_search(passes, start, upper=max_rate, lower=start / 16,
                           narrow=lambda lo, hi: hi - lo <= resolution * lo)
    return SearchResult(found.passing or 0.0,
                        math.inf if found.failing is None else found.failing, found.probes)


def search_concurrency(passes: Callable[[int], bool], start: int, resolution: float,
                       max_clients: int) -> SearchResult:
    """The most closed-loop clients under the SLOs: the rate's bracket search over whole
    clients, from ``start`` up to ``max_clients`` (a probe of that many requests holds no more)
    and down to 1, stopping when the bracket is within ``resolution`` of the passing count."""
    found = bracket_search(passes, start, upper=max_clients, lower=1, integer=True,
                           narrow=lambda lo, hi: hi - lo <= max(1.0, resolution * lo))
    return SearchResult(float(found.passing or 0),
                        math.inf if found.failing is None else float(found.failing), found.probes)


def check_outputs(requests: Sequence[Request],
                  reference: Callable[[Request], Optional[Sequence[int]]]) -> None:
    """Mark each completed request that has tokens and a ``reference`` (its prompt decoded
    alone; None: not in the sample) checked, with the first position where they differ."""
    for r in requests:
        if not r.completed or not r.output_ids:
            continue
        want = reference(r)
        if want is None:
            continue
        r.checked = True
        got = list(r.output_ids[:r.new_tokens])
        want = [int(t) for t in want[:r.new_tokens]]
        differs = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
        if differs or len(got) != len(want):
            r.first_mismatch = differs[0] if differs else min(len(got), len(want))


def output_metrics(requests: Sequence[Request]) -> dict[str, float]:
    """The check's figures from the records: requests checked, mismatched, and the earliest
    position any of them differed at (absent when none did)."""
    checked = [r for r in requests if r.checked]
    wrong = [r.first_mismatch for r in checked if r.first_mismatch is not None]
    out = {"serve_output_checked_requests": float(len(checked)),
           "mismatched_requests": float(len(wrong))}
    if wrong:
        out["first_mismatch_position"] = float(min(wrong))
    return out


def output_tags(figures: dict[str, float]) -> dict[str, str]:
    """``serve_outputs``: ``match``, ``mismatch`` or ``not_checked`` (no request had tokens to
    check: a model that is not an LM, or none completed); ``serve_outputs_mismatch`` the caveat's
    boolean beside it."""
    if not figures.get("serve_output_checked_requests"):
        return {"serve_outputs": "not_checked", "serve_outputs_mismatch": "false"}
    bad = figures.get("mismatched_requests", 0) > 0
    return {"serve_outputs": "mismatch" if bad else "match",
            "serve_outputs_mismatch": "true" if bad else "false"}


# ---- the worker side: a framework's step as a Server ------------------------------------------

def decoder_server(decoders: dict[int, Any], prompt: Callable[[int], np.ndarray],
                   clock: Callable[[], float] = time.perf_counter) -> Server:
    """A Server over a Decoder per bucket (the generate capability): prefill the padded batch,
    then decode; each token's time read after the device is waited on."""

    return DecoderServer(decoders, prompt, clock)


class DecoderServer:
    """decoder_server's Server; each call's token ids kept in ``outputs`` (the values the wait
    for the device read anyway) for the output check after the window."""

    def __init__(self, decoders: dict[int, Any], prompt: Callable[[int], np.ndarray],
                 clock: Callable[[], float]) -> None:
        self.decoders, self.prompt, self.clock = decoders, prompt, clock
        self.outputs: Optional[np.ndarray] = None

    def __call__(self, bucket: int, new_tokens: Sequence[int]) -> list[float]:
        decoder = self.decoders[bucket]
        token = decoder.prefill(self.prompt(bucket))
        ids = [decoder.tokens(token)]
        times = [self.clock()]
        for _ in range(max(new_tokens) - 1):
            token = decoder.step(token)
            ids.append(decoder.tokens(token))
            times.append(self.clock())
        self.outputs = np.stack(ids, axis=1)
        return times


def step_server(steps: dict[int, Callable[[], Any]],
                clock: Callable[[], float] = time.perf_counter) -> Server:
    """A Server over a forward step per bucket (the inference capability: each step returns once
    the device is done); one response per request."""

    def serve(bucket: int, new_tokens: Sequence[int]) -> list[float]:
        steps[bucket]()
        return [clock()]

    return serve


def options_of(options: Any) -> dict[str, Any]:
    """The serve knobs as plain values (``batch_buckets`` resolved, ``slo`` a dict), from the
    typed options or a JobSpec's JSON dict: their defaults are ``ServeOptions``' alone."""
    typed = from_json(ServeOptions, options)
    out = {f.name: getattr(typed, f.name) for f in dataclasses.fields(typed)}
    out.update(batch_buckets=typed.buckets, slo=typed.slo.as_dict())
    return out


def refusal(options: Any, lm: bool) -> Optional[str]:
    """Bad serve input, one line, before any work (issue 32 item 7); None when it may run."""
    try:
        typed = from_json(ServeOptions, options)
    except ValueError as e:
        return str(e)
    return typed.refusal(lm) or length_data_refusal(typed.length_dist, typed.length_data)


def _servers(backend: Any, buckets: Sequence[int], lm: bool, prompt_len: int,
             longest: int) -> Server:
    # static batching pads every prompt to ``prompt_len``, the longest drawn
    """One compiled step (or decoder) per bucket, each prepared on a resident batch of the
    bucket's size (the ``serve_buckets`` capability); a single bucket is build()'s batch."""
    from fxtrack.scenarios.generate import runner as generate

    def prepare() -> Any:
        if lm:
            return backend.capability("generate").prepare(backend, prompt_len, longest)
        return backend.capability("inference").prepare(backend)

    steps: dict[int, Any] = {}
    for bucket in buckets:
        if bucket == backend.spec.batch_size:
            steps[bucket] = prepare()
        else:
            with backend.capability("serve_buckets").resident(backend, bucket):
                steps[bucket] = prepare()
    if lm:
        prompts = {b: generate.prompts(backend, b, prompt_len) for b in buckets}
        return decoder_server(steps, prompts.__getitem__)
    return step_server(steps)


def _reference(backend: Any, prompt_of: Callable[[Request], np.ndarray],
               longest: int) -> Callable[[Sequence[Request]], None]:
    """The output check over a window's records: each prompt decoded alone (the generate
    capability's ``uncached``, batch 1, ``longest`` tokens: greedy decoding is the same on any
    prefix of them), once per run, at most MAX_REFERENCE_PROMPTS prompts."""
    references: dict[bytes, np.ndarray] = {}

    def check(requests: Sequence[Request]) -> None:
        wanted: dict[bytes, np.ndarray] = {}
        for r in requests:
            if r.completed and r.output_ids:
                p = np.asarray(prompt_of(r))
                key = p.tobytes()
                if (key not in references and key not in wanted
                        and len(references) + len(wanted) < MAX_REFERENCE_PROMPTS):
                    wanted[key] = p
        by_length: dict[int, list[tuple[bytes, np.ndarray]]] = {}
        for key, p in wanted.items():
            by_length.setdefault(len(p), []).append((key, p))
        for length, group in sorted(by_length.items()):  # one decoder per prompt length
            decoder = backend.capability("generate").prepare(backend, length, longest)
            for key, p in group:
                references[key] = np.asarray(decoder.uncached(p[None], longest))[0]
            del decoder
        check_outputs(requests, lambda r: references.get(np.asarray(prompt_of(r)).tobytes()))

    return check


def _compile_counter(backend: Any) -> tuple[Callable[[], Optional[int]], Optional[str]]:
    """The framework's count of compilations so far, and why not where it cannot count."""
    from fxtrack.frameworks.declaration import NotSupported

    try:
        module = backend.capability("serve_buckets")
    except NotSupported as e:
        return (lambda: None), f"not counted: {e}"
    if module.compiles(backend) is None:
        return (lambda: None), getattr(module, "NOT_COUNTED", "not counted")
    return (lambda: module.compiles(backend)), None


def slot_server(slots: Any, prompt_len: int) -> Server:
    """A slot decoder (continuous batching) as a Server for the warm-up, the first request and
    the search's first rate: ``len(new_tokens)`` requests of ``prompt_len`` tokens admitted at
    once, decoded until the longest ends."""

    def serve(bucket: int, new_tokens: Sequence[int]) -> list[float]:
        times = [slots.prefill(i, prompt_len) for i in range(len(new_tokens))]
        for _ in range(max(new_tokens) - 1):
            times.append(slots.step(list(range(len(new_tokens)))))
        return times[len(new_tokens) - 1:]

    return serve


@dataclasses.dataclass
class Window:
    """One served window: its rate (None: closed loop), records, figures and, in a search,
    its verdict."""

    rate: Optional[float]
    requests: list[Request]
    figures: dict[str, float]
    verdict: str = ""
    started_ms: Optional[int] = None  # epoch ms, for the child run's start and end
    ended_ms: Optional[int] = None
    concurrency: Optional[int] = None  # closed loop: its clients

    @property
    def load(self) -> float:
        """What a search varies: the rate, else the clients."""
        return self.rate if self.rate is not None else float(self.concurrency or 0)


def search_windows(probe: Callable[[Any, int], Window], start: float, resolution: float,
                   small: int, sized: Optional[int] = None, *,
                   find: Optional[Callable[[Callable[[Any], bool]], SearchResult]] = None,
                   ) -> tuple[list[Window], float, float, Window]:
    """The rate search over windows: ``probe(rate, requests)`` serves one and gives its verdict.
    Probes of ``small`` requests find the bracket; with ``sized`` (scenario.sized_tail) windows
    of that many then confirm the passing rates, highest first (confirm_rates). Returns every
    window, the highest passing rate (0: none), the lowest failing (inf: none) and the window
    whose figures are reported: the confirming one, else the highest passing probe's (else the
    last). ``find`` searches another load the same way (the clients: search_concurrency)."""
    probes: list[Window] = []

    def passes(load: Any, n: int = small) -> bool:
        probes.append(probe(load, n))
        return probes[-1].verdict == "pass"

    found = (find or (lambda p: search_rate(p, start, resolution, max_rate=1024 * start)))(passes)
    best, lowest = found.max_rate_rps, found.lowest_failing_rps
    if sized is not None:  # the small probes found the bracket; a full window confirms
        confirmed, refuted = confirm_rates([w.load for w in probes if w.verdict == "pass"],
                                           lambda load: passes(load, sized))
        lowest = min([lowest, *refuted])
        if confirmed is not None:
            return probes, confirmed, lowest, probes[-1]
        # none held at full size: the highest small pass below them (its p99 undersized)
        best = max((w.load for w in probes if w.verdict == "pass" and w.load < lowest),
                   default=0.0)
    passing = [w for w in probes if w.load == best and w.verdict == "pass"]
    return probes, best, lowest, (passing or probes[-1:])[-1]


def run(backend: Any, result: Any) -> None:
    """The worker's runner: build at the largest bucket, compile every bucket in the warm-up,
    serve the window (or search the rate: one window per probe, each a child run of this one),
    log the figures, the compilations inside the windows and the per-request records."""
    from fxtrack.scenarios.timed import build, open_window, record_window

    arch, options = backend.arch, backend.spec.options
    lm = families.of(arch).generates
    why = refusal(options, lm)
    if why is not None:
        raise ValueError(why)
    o = options_of(options)
    continuous = o["batching"] == "continuous"
    if continuous:  # NotSupported with the framework's declared reason, before any work
        slot_module = backend.capability("slot_decode")
    trained = bool(backend.spec.from_run)  # model.from_run: a converge run's weights served
    if trained:
        backend.capability("converge")  # before the build: NotSupported costs nothing
    buckets = sorted(set(o["batch_buckets"]))
    backend.spec.batch_size = max(buckets)
    seed = backend.spec.seed
    # scenario.sized_tail: a fixed-rate or closed-loop window, or a search's confirming ones,
    # hold enough requests for the p99 (refused with duration_s)
    sized = max(o["num_requests"], sized_requests()) if o["sized_tail"] else o["num_requests"]
    bound = MAX_TIMED_REQUESTS if o["duration_s"] is not None else sized
    # each request's prompt and output lengths, drawn ahead (seeded): the compiled shapes are
    # sized for the longest drawn
    if lm:
        prompt_lens, tokens = request_lengths(bound, int(o["prompt_len"]), int(o["new_tokens"]),
                                              o["length_dist"], o["length_sigma"], seed,
                                              o["length_data"])
    else:
        tokens, prompt_lens = [1] * bound, [0] * bound
    new_tokens, longest = (int(o["new_tokens"]), max(tokens)) if lm else (1, 1)
    prompt_len = max(prompt_lens) if lm else int(o["prompt_len"])
    # cold start, apart from the warm window: what a replica scaled up pays before serving
    t = time.perf_counter()
    build(backend, result)
    if trained:  # the trained weights before anything is compiled: what a replica loads
        accuracy.load(backend)
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    if continuous:
        slots = slot_module.prepare_slots(backend, o["max_batch"], prompt_buckets(prompt_len),
                                          longest)
        server = slot_server(slots, prompt_len)
    else:
        server = _servers(backend, buckets, lm, prompt_len, longest)
    first = time.perf_counter()
    server(buckets[0], [longest])  # the first request after start, before any warm-up
    first_request_ms = (time.perf_counter() - first) * 1e3
    for bucket in buckets[1:]:
        server(bucket, [longest])
    if continuous:  # every prompt bucket's prefill, into every slot (each slot's cache view)
        for padded in slots.buckets:
            for slot in range(o["max_batch"]):
                slots.prefill(slot, padded)
    compile_s = time.perf_counter() - t  # every bucket prepared and run once
    # one line each, TTY or not: a 1B model's compile on a GPU took minutes before its first probe
    eprint(f"[fxtrack] serve: built in {load_s:.1f} s, {len(buckets)} bucket(s) compiled and "
           f"run once in {compile_s:.1f} s; first request {first_request_ms:,.0f} ms")
    for _ in range(max(1, int(result.resolved["warmup_steps"])) - 1):  # the rest of warm-up
        for bucket in buckets:
            server(bucket, [longest])
    compiles, uncounted = _compile_counter(backend)

    served: list[int] = []  # requests of every window (a search's probes included)
    if lm:  # the output check: which prompt each request was given, decoded alone after
        if continuous:  # a slot's prompt: the first prompt_len tokens of the seeded one
            check = _reference(backend, lambda r: slots.ids[0, :r.prompt_len], longest)
        else:  # static: its row of its bucket's batch, every prompt padded to prompt_len
            from fxtrack.scenarios.generate import runner as generate

            rows = {b: generate.prompts(backend, b, prompt_len) for b in buckets}
            check = _reference(backend, lambda r: rows[r.bucket][r.batch_row], longest)
    checks: list[Window] = []  # every window checked (a search's probes included)
    check_s: list[float] = []

    def window(rate: Optional[float], n: int = bound,
               clients: Optional[int] = None) -> Window:
        before = compiles()
        started_ms = int(time.time() * 1000)  # wall clock: the probe's child run's start
        if rate is None:
            reqs = serve_window(server, max_batch=o["max_batch"], max_wait_ms=o["max_wait_ms"],
                                buckets=buckets, tokens=tokens[:n], duration_s=o["duration_s"],
                                concurrency=clients, prompt_lens=prompt_lens,
                                timeout_ms=o["timeout_ms"])
        else:
            if o["duration_s"] is not None:  # (one seeded draw of arrivals per rate)
                arrivals = arrivals_within(rate, o["burstiness"], seed, o["duration_s"])
            else:
                gaps = arrival_gaps(rate, n, o["burstiness"], seed)
                arrivals = np.concatenate([[0.0], np.cumsum(gaps[1:])])
            if continuous:
                reqs = [Request(i, float(a), int(k), prompt_len=int(n))
                        for i, (a, k, n) in enumerate(zip(arrivals, tokens, prompt_lens))]
                continuous_window(slots, reqs, max_batch=o["max_batch"],
                                  timeout_ms=o["timeout_ms"])
            else:
                reqs = serve_window(server, max_batch=o["max_batch"],
                                    max_wait_ms=o["max_wait_ms"], buckets=buckets,
                                    tokens=tokens[:len(arrivals)], arrivals_s=arrivals,
                                    prompt_lens=prompt_lens[:len(arrivals)],
                                    timeout_ms=o["timeout_ms"])
        ended_ms = int(time.time() * 1000)
        figures = request_metrics(reqs, o["slo"], lm, rate)
        served.append(len(reqs))
        if before is not None:  # compilations inside the window: 0 when warm-up covered it
            figures["serve_recompiles"] = float(compiles() - before)
        w = Window(rate, reqs, figures, started_ms=started_ms, ended_ms=ended_ms,
                   concurrency=clients)
        if lm:  # after the window's clock stopped: the references cost it nothing
            t = time.perf_counter()
            check(reqs)
            check_s.append(time.perf_counter() - t)
            figures.update(output_metrics(reqs))
            checks.append(w)
        return w

    m = result.metrics
    # every window measured as the timed scenarios' are: the contention check, system metrics,
    # on a GPU its NVML figures (scenarios/timed.py)
    kind = result.resolved["device_kind"]
    measured = open_window(backend.spec, kind)
    children: list[dict[str, Any]] = []

    def probe(w: Window) -> Window:
        """A search's window: its verdict, its child run (kept if the worker dies), a line."""
        w.verdict = probe_verdict(w.figures, o["slo"])
        children.append(_child(backend, len(children), w))
        append_child(backend.spec.result_path, children[-1])
        f, n = w.figures, len(w.requests)
        load = f"{w.rate:g} req/s x {n}" if w.rate is not None else f"{w.concurrency} clients x {n}"
        # numbered as its child run is named (probe0, probe1, ...)
        eprint(f"[fxtrack] serve probe {len(children) - 1}: {load}: "
               f"{w.verdict} (e2e p99 {f.get('serve_e2e_ms_p99', math.nan):,.0f} ms, "
               f"queue p99 {f.get('serve_queue_ms_p99', math.nan):,.0f} ms)")
        return w

    def searched(probes: list[Window], lowest: float, series: str, unfailed: str) -> None:
        """What both searches log beside their answer: why the lowest failing probe failed,
        each probe's load and figures as series, the probes as child runs."""
        failing = [w for w in probes if w.load == lowest and w.verdict != "pass"]
        result.tags["serve_search_stop"] = failing[-1].verdict if failing else unfailed
        result.series[series] = [w.load for w in probes]
        result.series["serve_probe_achieved_rps"] = [w.figures["request_throughput_rps"]
                                                     for w in probes]
        for k in ("serve_e2e_ms_p99", "serve_tpot_ms_p99", "goodput_rps"):
            if k in probes[0].figures:
                result.series[f"serve_probe_{k}"] = [w.figures[k] for w in probes]
        result.tags["serve_probes"] = str(len(probes))
        result.children = children
        # every window's compilations, the probes' included
        if uncounted is None:
            reported.figures["serve_recompiles"] = sum(w.figures["serve_recompiles"]
                                                       for w in probes)

    with measured.sampling():
        if o["concurrency"] == "search":
            # from max_batch clients (one full batch), the rate's bracket search over whole
            # clients, up to one per request of a probe
            probes, best, lowest, reported = search_windows(
                lambda c, n: probe(window(None, n, clients=int(c))), o["max_batch"],
                o["resolution"], o["num_requests"], sized if o["sized_tail"] else None,
                find=lambda passes: search_concurrency(
                    passes, min(o["max_batch"], o["num_requests"]), o["resolution"],
                    o["num_requests"]))
            m["max_concurrency_under_slo"] = best
            if math.isfinite(lowest):
                m["lowest_failing_concurrency"] = lowest
            searched(probes, lowest, "serve_probe_concurrency", "max_clients")
        elif o["concurrency"] is not None:
            reported = window(None, clients=int(o["concurrency"]))
        elif o["rate"] == "search":
            # a first rate from one unloaded batch (its service time bounds what one bucket
            # serves), snapped down to a power of two: every framework's probes then lie on the
            # same grid (doubling, halving, bisecting), so the report finds rates all measured
            t = time.perf_counter()
            server(buckets[-1], [new_tokens])
            start = 2.0 ** math.floor(math.log2(max(0.5, buckets[-1] / (time.perf_counter() - t) / 4)))
            probes, best, lowest, reported = search_windows(
                lambda rate, n: probe(window(rate, n)), start, o["resolution"],
                o["num_requests"], sized if o["sized_tail"] else None)
            m.update(max_rate_under_slo_rps=best, highest_passing_rate_rps=best)
            if math.isfinite(lowest):
                m["lowest_failing_rate_rps"] = lowest
            searched(probes, lowest, "serve_probe_rate_rps", "max_rate")
        else:
            reported = window(float(o["rate"]))
            if o["probe_of"]:  # a sweep's window at a common rate: one more probe of a search
                result.tags.update(serve_probe_of=o["probe_of"],
                                   serve_probe=probe_verdict(reported.figures, o["slo"]))
    record_window(backend, result, measured, kind, sum(served))
    m.update(reported.figures)
    m["param_count"] = float(backend.param_count())
    m.update(load_s=load_s, compile_s=compile_s, first_request_ms=first_request_ms)
    if checks:  # every window's check, a search's probes included: one mismatch marks the run
        m.update(output_metrics([r for w in checks for r in w.requests]))
        m["serve_output_check_s"] = sum(check_s)
    result.tags.update(tail_tags(reported.figures), **output_tags(m))
    # asked for a sized tail: whether the reported p99 got it (failures or a search whose
    # confirming windows all failed can leave it short)
    result.tags["serve_tail_sized"] = ("false" if not o["sized_tail"] else "could_not"
                                       if result.tags["serve_p99_undersized"] == "true" else "true")
    if uncounted is not None:
        result.tags["serve_recompiles_not_counted"] = uncounted
    elif m["serve_recompiles"] > 0:  # a shape the warm-up did not compile: the window paid it
        result.guard = (f"{m['serve_recompiles']:.0f} compilation(s) inside the serving "
                        "window: a shape the warm-up did not compile")
    if "achieved_rate_rps" in reported.figures:
        f = reported.figures
        short = f["achieved_rate_rps"] < (1 - RATE_SHORT_FRACTION) * f["requested_rate_rps"]
        result.tags["serve_rate_short"] = "true" if short else "false"
    if lm and o["length_dist"] == "dataset":
        result.tags["serve_length_data"] = o["length_data"]
    if continuous:
        result.tags.update(serve_prefill=getattr(slot_module, "PREFILL", "whole"),
                           serve_prompt_buckets=",".join(map(str, slots.buckets)))
    result.tags.update(serve_mode="closed" if o["concurrency"] is not None else "open",
                       serve_batching=o["batching"],
                       serve_length_dist=o["length_dist"] if lm else "fixed",
                       serve_buckets=",".join(map(str, buckets)))
    result.series["serve_request_e2e_ms"] = [r.e2e_ms() for r in reported.requests
                                             if r.completed]
    path = Path(backend.spec.result_path).with_name("serve_requests.json")
    path.write_text(json.dumps([r.row() for r in reported.requests]))
    result.artifacts["serve_requests"] = str(path)
    if trained:  # the served weights scored on the run's held-out split, after the windows
        accuracy.evaluate(backend, result)


def _child(backend: Any, index: int, w: Window) -> dict[str, Any]:
    """A rate-search probe as the child run the orchestrator logs under this run: its own
    figures, verdict and per-request records."""
    path = Path(backend.spec.result_path).with_name(f"serve_requests_probe{index}.json")
    path.write_text(json.dumps([r.row() for r in w.requests]))
    load = f"rate{w.rate:.3g}" if w.rate is not None else f"clients{w.concurrency}"
    return {"suffix": f"probe{index}-{load}", "metrics": dict(w.figures),
            # each probe's p99 against the early-stopping minimum: a probe too small says so
            "tags": {"serve_probe": w.verdict, "serve_probe_index": str(index),
                     **tail_tags(w.figures), **output_tags(w.figures)},
            "series": {"serve_request_e2e_ms": [r.e2e_ms() for r in w.requests
                                                if r.completed]},
            "artifacts": {"serve_requests": str(path)},
            "start_time_ms": w.started_ms, "end_time_ms": w.ended_ms}
