"""scenario=serve's framework-free parts (fxtrack/scenarios/serve.py) against a fake server
whose service time is fixed, on a virtual clock: fast and exact."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fxtrack.scenarios import serve


class VirtualClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.0)


def fake_server(clock: VirtualClock, prefill_s: float, per_token_s: float):
    """A fixed service time: prefill then one decode step per token, whatever the bucket."""

    def server(bucket, new_tokens):
        clock.t += prefill_s
        times = [clock.t]
        for _ in range(max(new_tokens) - 1):
            clock.t += per_token_s
            times.append(clock.t)
        return times

    return server


def window(clock, server, rate, n=64, max_batch=4, max_wait_ms=5.0, tokens=None, seed=0):
    arrivals = np.cumsum(serve.arrival_gaps(rate, n, 1.0, seed))
    return serve.serve_window(server, max_batch=max_batch, max_wait_ms=max_wait_ms,
                              buckets=[max_batch], tokens=tokens or [1] * n,
                              arrivals_s=arrivals - arrivals[0], clock=clock, sleep=clock.sleep)


def test_arrivals_are_poisson_at_the_requested_rate():
    rate, n = 50.0, 4000
    gaps = serve.arrival_gaps(rate, n, burstiness=1.0, seed=7)
    assert abs(gaps.mean() * rate - 1) < 0.05  # mean gap 1/rate
    assert abs(gaps.std() / gaps.mean() - 1) < 0.05  # exponential: coefficient of variation 1
    # Kolmogorov-Smirnov against the exponential CDF, 1% level
    xs = np.sort(gaps)
    cdf = 1 - np.exp(-rate * xs)
    d = max((np.arange(1, n + 1) / n - cdf).max(), (cdf - np.arange(n) / n).max())
    assert d < 1.63 / math.sqrt(n)
    # a burstier process (shape 0.25) keeps the rate with gaps far more variable
    bursty = serve.arrival_gaps(rate, n, burstiness=0.25, seed=7)
    assert abs(bursty.mean() * rate - 1) < 0.1 and bursty.std() / bursty.mean() > 1.7


def test_lm_figures_from_the_records_equal_the_logged_ones():
    clock = VirtualClock()
    tokens = serve.token_counts(40, 8, 3, seed=1)
    reqs = window(clock, fake_server(clock, 0.02, 0.005), rate=30.0, n=40, tokens=tokens)
    figures = serve.request_metrics(reqs, {"ttft_ms": None, "tpot_ms": None, "e2e_ms": None},
                                    lm=True, rate=30.0)
    rows = json.loads(json.dumps([r.row() for r in reqs]))  # as the artifact holds them
    ttft = [(r["first_token_s"] - r["arrival_s"]) * 1e3 for r in rows]
    tpot = [(r["end_s"] - r["first_token_s"]) * 1e3 / (r["tokens"] - 1) for r in rows
            if r["tokens"] > 1]
    itl = [(b - a) * 1e3 for r in rows for a, b in zip(r["token_s"], r["token_s"][1:])]
    e2e = [(r["end_s"] - r["arrival_s"]) * 1e3 for r in rows]
    for name, values in (("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl), ("e2e_ms", e2e)):
        for q in (50, 90, 99):
            assert figures[f"serve_{name}_p{q}"] == pytest.approx(np.percentile(values, q))
    assert [r["tokens"] for r in rows] == tokens  # each request got its own number of tokens
    assert figures["serve_tpot_ms_p50"] == pytest.approx(5.0)  # the fixed decode step
    assert figures["serve_itl_ms_p99"] == pytest.approx(5.0)
    assert figures["mean_batch_size"] > 1  # the batcher did batch


def test_goodput_counts_exactly_the_requests_meeting_every_slo():
    def request(i, ttft, tpot, n=5):
        first = ttft / 1e3
        return serve.Request(i, 0.0, n, 0.0, [first + k * tpot / 1e3 for k in range(n)], i)

    reqs = [request(0, 10, 2), request(1, 30, 2), request(2, 10, 9), request(3, 40, 9),
            request(4, 5, 1)]
    for r in reqs:  # span 1 s: goodput is the count
        r.arrival_s = 0.0
    span = max(r.end_s for r in reqs)
    slo = {"ttft_ms": 20.0, "tpot_ms": 5.0, "e2e_ms": None}
    figures = serve.request_metrics(reqs, slo, lm=True, rate=None)
    assert figures["goodput_rps"] == pytest.approx(2 / span)  # requests 0 and 4 only
    assert figures["slo_attained_fraction"] == pytest.approx(2 / 5)
    slo["e2e_ms"] = 15.0  # request 0 ends at 18 ms: now only request 4 (9 ms)
    assert serve.request_metrics(reqs, slo, True, None)["goodput_rps"] == pytest.approx(1 / span)
    slo = {"ttft_ms": None, "tpot_ms": None, "e2e_ms": None}  # none set: every request counts
    assert serve.request_metrics(reqs, slo, True, None)["slo_attained_fraction"] == 1.0


def test_rate_search_brackets_a_known_threshold():
    found = serve.search_rate(lambda r: r <= 37.3, start=1.0, resolution=0.05)
    assert found.max_rate_rps <= 37.3 < found.lowest_failing_rps
    assert found.lowest_failing_rps - found.max_rate_rps <= 0.05 * found.max_rate_rps
    assert [r for r, _ in found.probes[:6]] == [1, 2, 4, 8, 16, 32]  # doubled first
    low = serve.search_rate(lambda r: r <= 0.3, start=4.0, resolution=0.1)  # start too high
    assert low.max_rate_rps <= 0.3 < low.lowest_failing_rps


def test_rate_search_brackets_the_capacity_of_a_fixed_service_time_server():
    # one batch of up to 4 takes 50 ms: capacity 80 requests/s; above it the queue grows
    capacity = 4 / 0.05
    slo = {"ttft_ms": None, "tpot_ms": None, "e2e_ms": 400.0}

    def passes(rate):
        clock = VirtualClock()
        reqs = window(clock, fake_server(clock, 0.05, 0.0), rate, n=2000)
        return serve.slo_passes(serve.request_metrics(reqs, slo, False, rate), slo)

    found = serve.search_rate(passes, start=5.0, resolution=0.05)
    # the seeded gaps' sample mean sits within ~2% of 1/rate at 2000 requests
    assert 0.5 * capacity < found.max_rate_rps <= 1.03 * capacity < 1.3 * found.lowest_failing_rps


def test_overload_gives_rising_latency_not_a_crash():
    p99 = []
    for n in (50, 100, 200):
        clock = VirtualClock()
        reqs = window(clock, fake_server(clock, 0.05, 0.0), rate=400.0, n=n)  # 5x capacity
        assert len(reqs) == n and all(len(r.token_s) == 1 for r in reqs)
        p99.append(serve.request_metrics(reqs, {"e2e_ms": None}, False, 400.0)["serve_e2e_ms_p99"])
    assert p99[0] < p99[1] < p99[2]
    assert p99[2] > 1.8 * p99[1]  # the queue's wait grows with the requests sent


def test_closed_loop_keeps_concurrency_requests_in_flight():
    clock = VirtualClock()
    reqs = serve.serve_window(fake_server(clock, 0.01, 0.0), max_batch=4, max_wait_ms=0.0,
                              buckets=[4, 8], tokens=[1] * 20, concurrency=2, clock=clock,
                              sleep=clock.sleep)
    assert len(reqs) == 20 and {r.bucket for r in reqs} == {4}
    assert all(r.batch_id == i // 2 for i, r in enumerate(reqs))  # two at a time


def test_achieved_rate_is_logged_beside_the_requested():
    clock = VirtualClock()
    reqs = window(clock, fake_server(clock, 0.001, 0.0), rate=20.0, n=2000)
    figures = serve.request_metrics(reqs, {"e2e_ms": None}, False, 20.0)
    assert figures["requested_rate_rps"] == 20.0
    assert figures["achieved_rate_rps"] == pytest.approx(20.0, rel=0.1)


@pytest.mark.parametrize("options, lm, message", [
    ({"slo": {"tpot_ms": 5}}, False, "scenario.slo.tpot_ms is a language-model figure"),
    ({"max_batch": 8, "batch_buckets": [2, 4], "slo": {"e2e_ms": 1}}, True, "do not cover"),
    ({"rate": "0"}, True, "scenario.rate must be > 0"),
    ({"rate": "fast"}, True, "must be a number"),
    ({"rate": "search"}, True, "needs an SLO"),
])
def test_bad_serve_input_is_refused_in_one_line(options, lm, message):
    why = serve.refusal(options, lm)
    assert why is not None and message in why and "\n" not in why


def test_good_serve_input_passes():
    assert serve.refusal({"rate": "4", "slo": {"tpot_ms": 5}}, lm=True) is None
    assert serve.refusal({"rate": "search", "slo": {"e2e_ms": 50}}, lm=False) is None


def test_the_serving_section_ranks_max_rate_against_the_best():
    import pandas as pd

    from fxtrack.report import serving

    runs = pd.DataFrame([
        {"scenario": "serve", "model": "llama", "framework": "torch", "contended": "true",
         "max_rate_under_slo_rps": 4.0, "serve_e2e_ms_p99": 900.0, "goodput_rps": 3.5},
        {"scenario": "serve", "model": "llama", "framework": "jax", "contended": "false",
         "max_rate_under_slo_rps": 8.0, "serve_e2e_ms_p99": 700.0, "goodput_rps": 7.0},
        {"scenario": "train", "model": "vit", "framework": "jax"}])
    section = serving.section(runs)
    assert section.title == "Serving" and len(section.tables) == 1
    rows = {r[0]: r for r in section.tables[0].rows}
    assert rows["jax"][2] == "1.00x" and rows["torch (contended)"][2] == "0.50x"
    assert serving.section(runs[runs["scenario"] == "train"]) is None
