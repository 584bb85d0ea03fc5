"""scenario=serve's framework-free parts (fxtrack/scenarios/serve.py) against a fake server
whose service time is fixed, on a virtual clock: fast and exact."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from fxtrack.scenarios import batching
from fxtrack.scenarios.serve import runner as serve


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
    tokens = batching.draw_lengths(40, 8, "uniform", 3 / 8, seed=1)  # 8 +- 3
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
    ({"rate": "0"}, True, "scenario.rate must be a positive number"),
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

    from fxtrack.scenarios.serve import section as serving

    runs = pd.DataFrame([
        # select.latest_runs' column of each declared caveat (fxtrack.metrics.CAVEATS)
        {"scenario": "serve", "model": "llama", "framework": "torch", "caveat.contended": "true",
         "run_id": "t", "metrics.max_rate_under_slo_rps": 4.0,
         "metrics.serve_e2e_ms_p99": 900.0, "metrics.goodput_rps": 3.5},
        {"scenario": "serve", "model": "llama", "framework": "jax", "caveat.contended": "false",
         "run_id": "j", "metrics.max_rate_under_slo_rps": 8.0,
         "metrics.serve_e2e_ms_p99": 700.0, "metrics.goodput_rps": 7.0},
        {"scenario": "train", "model": "vit", "framework": "jax", "run_id": "v"}])
    section = serving.section(runs)
    assert section.title == "Serving" and len(section.tables) == 2
    rows = {r[0]: r for r in section.tables[0].rows}
    assert rows["jax"][2] == "1.00x" and rows["torch (contended)"][2] == "0.50x"
    assert rows["jax"][4] == "700.0" and rows["torch (contended)"][6] == "3.50"  # the logged figures
    assert serving.section(runs[runs["scenario"] == "train"]) is None


def _probe(parent, rate, throughput, e2e, goodput, verdict):
    return {"run_id": f"{parent}-{rate}", "tags.mlflow.parentRunId": parent,
            "tags.fxtrack.serve_probe": verdict, "metrics.requested_rate_rps": rate,
            "metrics.request_throughput_rps": throughput, "metrics.serve_e2e_ms_p99": e2e,
            "metrics.goodput_rps": goodput, "metrics.slo_attained_fraction": goodput / throughput}


def test_the_serving_section_charts_the_windows_and_compares_goodput_at_a_common_rate(tmp_path):
    import pandas as pd

    from fxtrack.scenarios.serve import section as serving

    runs = pd.DataFrame([
        {"scenario": "serve", "model": "vit", "framework": "torch", "run_id": "t",
         "metrics.max_rate_under_slo_rps": 6.0},
        {"scenario": "serve", "model": "vit", "framework": "jax", "run_id": "j",
         "metrics.max_rate_under_slo_rps": 12.0}])
    probes = pd.DataFrame([  # torch doubled 2, 4, 8 and bisected to 6; jax doubled 4, 8, 16
        _probe("t", 2.0, 2.0, 50.0, 2.0, "pass"), _probe("t", 4.0, 4.0, 60.0, 4.0, "pass"),
        _probe("t", 8.0, 6.5, 900.0, 1.0, "slo"), _probe("t", 6.0, 6.0, 80.0, 5.5, "pass"),
        _probe("j", 4.0, 4.0, 30.0, 4.0, "pass"), _probe("j", 8.0, 8.0, 40.0, 8.0, "pass"),
        _probe("j", 16.0, 12.0, 800.0, 2.0, "saturated")])
    frame = pd.concat([runs, probes], ignore_index=True)
    section = serving.section(runs, frame)
    common = section.tables[1]
    # the highest rate both served within the SLOs: 4 (torch failed 8, jax passed it)
    assert common.title == "Serving: vit, goodput at a common rate (4 req/s)"
    assert {r[0]: r[1] for r in common.rows} == {"torch": "4.00", "jax": "4.00"}
    drawn = serving.charts(frame, runs, tmp_path, None)
    assert [c.path.name for c in drawn] == ["serve-vit-e2e.png"]  # no TPOT for a vision model
    assert drawn[0].path.stat().st_size > 0
    lines = {fw: serving.windows(frame, r) for fw, (_, r) in zip(("torch", "jax"), runs.iterrows())}
    assert [w.passed for w in lines["torch"]] == [True, True, False, True]
    assert serving.common_rate({"a": lines["torch"][:1], "b": lines["jax"]}) is None
    # no rate both served: the highest both measured a window at
    assert serving.common_rate({"a": lines["torch"][2:3], "b": lines["jax"]}) == 8.0
    # scenario.sized_tail: a 464-request window confirming 6 req/s (it failed its SLO at that
    # size) replaces the small probe at that rate in the curve
    confirm = {**_probe("t", 6.0, 5.0, 950.0, 1.5, "slo"), "run_id": "t-6-full",
               "metrics.serve_requests": 464.0}
    frame = pd.concat([frame, pd.DataFrame([confirm])], ignore_index=True)
    torch_line = serving.windows(frame, runs.iloc[0])
    assert [(w.rate, w.passed, w.e2e_p99) for w in torch_line] == [
        (2.0, True, 50.0), (4.0, True, 60.0), (8.0, False, 900.0), (6.0, False, 950.0)]


@pytest.mark.slow
def search_and_probes(tmp_path: Path, proc) -> tuple:
    """(client, the search's parent run, its probe runs) of a finished search in ``tmp_path``'s
    store: the run exited 0, and every probe the parent counts is a child run of it."""
    import mlflow

    assert proc.returncode == 0, proc.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("fxtrack").experiment_id])
    (parent,) = [r for r in runs if "fxtrack.serve_probes" in r.data.tags]
    probes = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(probes) == int(parent.data.tags["fxtrack.serve_probes"]) >= 2
    return client, parent, probes


def test_a_tiny_rate_search_logs_each_probe_as_a_child_run(tmp_path):
    """torch, tiny Llama, two buckets: the parent keeps the answer and the bracket; each probe
    is a child run with its own figures, verdict and records; the report folds them in."""
    pytest.importorskip("mlflow")
    from conftest import report_here, run_fxtrack, seed_peak_cache

    env = seed_peak_cache(tmp_path / "cache")
    proc = run_fxtrack(tmp_path, "scenario=serve", "framework=torch", "model=llama", "size=tiny",
                       "hardware=cpu", "scenario.rate=search", "scenario.slo.e2e_ms=5000",
                       "scenario.num_requests=6", "scenario.prompt_len=8",
                       "scenario.new_tokens=3", "scenario.max_batch=2",
                       "scenario.batch_buckets=[1,2]", "scenario.resolution=0.5",
                       "warmup_steps=1", env=env)
    client, parent, probes = search_and_probes(tmp_path, proc)
    shown = [line for line in (proc.stdout + proc.stderr).splitlines()
             if line.startswith("[fxtrack] serve probe ")]  # progress: one line per probe
    assert len(shown) == len(probes) and "req/s x 6: " in shown[0], shown
    verdicts = {float(r.data.tags["fxtrack.serve_probe_index"]): r.data.tags["fxtrack.serve_probe"]
                for r in probes}
    assert set(verdicts.values()) <= {"pass", "slo", "saturated"}
    m = parent.data.metrics
    passing = [r.data.metrics["requested_rate_rps"] for r in probes
               if r.data.tags["fxtrack.serve_probe"] == "pass"]
    failing = [r.data.metrics["requested_rate_rps"] for r in probes
               if r.data.tags["fxtrack.serve_probe"] != "pass"]
    assert m["max_rate_under_slo_rps"] == pytest.approx(max(passing, default=0.0))
    if failing:
        assert m["lowest_failing_rate_rps"] == pytest.approx(min(failing))
    for r in probes:  # each probe's own figures and records
        assert r.data.tags["fxtrack.serve_probe_of"] == parent.data.tags["fxtrack.result_id"]
        assert r.data.metrics["serve_requests"] == 6 and "serve_e2e_ms_p99" in r.data.metrics
        assert r.data.metrics["serve_recompiles"] == 0
        assert [a.path for a in client.list_artifacts(r.info.run_id)] == ["serve_requests.json"]
    assert m["serve_recompiles"] == 0
    report = report_here(tmp_path, "--out", str(tmp_path / "rep"))
    assert report.returncode == 0, report.stderr[-2000:]
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "Serving: llama" in text and "1 kept" in report.stdout


def test_a_tpot_only_search_stops_where_the_server_saturates():
    """Static batching: queueing delays the first token, not the gaps between tokens, so a
    TPOT-only SLO holds at any rate; the search still brackets capacity because a probe whose
    admissions fall behind its arrivals fails as saturated."""
    capacity = 4 / (0.02 + 4 * 0.005)  # a batch of up to 4, 5 tokens each: 40 ms -> 100 req/s
    slo = {"ttft_ms": None, "tpot_ms": 10.0, "e2e_ms": None}

    def figures(rate):
        clock = VirtualClock()
        reqs = window(clock, fake_server(clock, 0.02, 0.005), rate, n=2000, tokens=[5] * 2000)
        return serve.request_metrics(reqs, slo, True, rate)

    overloaded = figures(5 * capacity)
    assert serve.slo_passes(overloaded, slo)  # the SLO alone never fails ...
    assert serve.probe_verdict(overloaded, slo) == "saturated"  # ... saturation does
    assert overloaded["completion_rate_rps"] == pytest.approx(capacity, rel=0.02)
    assert overloaded["admission_rate_rps"] == pytest.approx(capacity, rel=0.02)
    assert serve.probe_verdict(figures(0.5 * capacity), slo) == "pass"
    found = serve.search_rate(lambda r: serve.probe_verdict(figures(r), slo) == "pass",
                              start=5.0, resolution=0.05)
    # passes up to capacity / (1 - SATURATED_FRACTION), plus the seeded gaps' ~2% sampling
    assert 0.8 * capacity < found.max_rate_rps <= 1.03 * capacity / 0.9
    assert found.lowest_failing_rps < 1.3 * capacity


def test_each_batch_is_padded_to_the_smallest_bucket_that_holds_it():
    clock = VirtualClock()
    calls = []

    def server(bucket, new_tokens):
        calls.append((bucket, len(new_tokens)))
        clock.t += 0.01
        return [clock.t]

    arrivals = np.cumsum(serve.arrival_gaps(150.0, 200, 1.0, 3))
    reqs = serve.serve_window(server, max_batch=4, max_wait_ms=5.0, buckets=[1, 2, 4],
                              tokens=[1] * 200, arrivals_s=arrivals - arrivals[0], clock=clock,
                              sleep=clock.sleep)
    assert {size for _, size in calls} >= {1, 2, 3}  # the load gives batches of several sizes
    assert all(bucket == serve.bucket_for(size, [1, 2, 4]) for bucket, size in calls)
    assert {r.bucket for r in reqs} == {1, 2, 4}


def test_duration_s_bounds_the_window_open_and_closed():
    times = serve.arrivals_within(40.0, 1.0, seed=5, duration_s=10.0)
    assert times[0] == 0.0 and times[-1] <= 10.0 and abs(len(times) - 400) < 3 * 20  # ~Poisson sd
    longer = serve.arrivals_within(40.0, 1.0, seed=5, duration_s=20.0)
    assert list(longer[:len(times)]) == list(times)  # the same seeded process, cut later
    clock = VirtualClock()
    reqs = serve.serve_window(fake_server(clock, 0.1, 0.0), max_batch=2, max_wait_ms=0.0,
                              buckets=[2], tokens=[1] * 10_000, concurrency=2, duration_s=3.0,
                              clock=clock, sleep=clock.sleep)
    assert len(reqs) == 60 and max(r.arrival_s for r in reqs) < 3.0  # 30 batches of 2 in 3 s


@pytest.mark.parametrize("framework", [pytest.param("torch", marks=pytest.mark.slow), "jax"])
def test_no_compilation_inside_the_window_of_the_compiled_paths(framework, tmp_path):
    """Tiny Llama, compiled (inductor, jit), two buckets: every bucket is compiled in the
    warm-up, so the window counts none; the counter did count the warm-up's."""
    pytest.importorskip(framework)
    from conftest import job_spec

    from fxtrack.frameworks.declaration import declaration
    from fxtrack.worker.__main__ import run

    options = {"prompt_len": 8, "new_tokens": 3, "rate": "40", "num_requests": 8,
               "max_batch": 2, "batch_buckets": [1, 2], "slo": {}}
    spec = job_spec(framework, "llama", tmp_path, scenario="serve",
                    runner="fxtrack.scenarios.serve.runner:run", options=options, compile=True,
                    batch_size=None, warmup_steps=1)
    result = run(spec)
    assert result.status == "FINISHED" and result.guard == "ok", result.error
    assert result.metrics["serve_recompiles"] == 0
    assert result.tags["serve_buckets"] == "1,2"
    # the host's load sampled through the windows decides the contended tag, as for training:
    # the windows' own figure, and the probe before them where the windows were too short to
    # trust alone (host_load.window_figures), so only the probe's verdict may go either way
    from fxtrack.measure.host_load import is_contended
    m = result.metrics
    if is_contended(m["host_other_cpu_frac"]):
        assert result.tags["contended"] == "true"
    elif not is_contended(m["host_other_cpu_frac_before"]):
        assert result.tags["contended"] == "false"
    # measured as every scenario is (scenarios/timed.py's window): the system metrics read
    # through the windows, each value with its time, and the probe before them
    cpu = result.series["system/cpu_utilization_percentage"]
    assert len(cpu) >= 2 and len(result.series_times_ms["system/cpu_utilization_percentage"]) == len(cpu)
    assert "system/system_memory_usage_megabytes" in result.series
    assert "host_other_cpu_frac_before" in result.metrics
    rows = json.loads(Path(result.artifacts["serve_requests"]).read_text())
    assert {r["bucket"] for r in rows} <= {1, 2} and len(rows) == 8
    counter = declaration(spec.package).capability("serve_buckets")
    assert counter.compiles(None) > 0  # the warm-up's compilations were counted


def test_tensorflow_says_it_cannot_count_compilations():
    pytest.importorskip("tensorflow")
    from fxtrack.frameworks.tensorflow import buckets

    assert buckets.compiles(None) is None and buckets.NOT_COUNTED.startswith("not counted")


@pytest.mark.parametrize("options, message", [
    ({"rate": "4", "duration_s": 0}, "scenario.duration_s must be a positive number"),
    ({"rate": "4", "batch_buckets": [0, 4]}, "each 1 or more"),
    ({"rate": "4", "token_spread": 3}, "folded into scenario.length_dist=uniform"),
    ({"rate": "4", "batching": "dynamic"}, "scenario.batching must be one of static|continuous"),
    ({"rate": "4", "length_dist": "zipf"}, "scenario.length_dist must be one of"),
    ({"rate": "4", "length_dist": "uniform", "length_sigma": 1.5}, "below 1"),
    ({"rate": "4", "timeout_ms": 0}, "scenario.timeout_ms must be a positive number"),
    ({"rate": "4", "batching": "continuous"}, "a language model's"),
    ({"concurrency": 2, "batching": "continuous"}, "serves an open loop"),
    ({"rate": "4", "duration_s": 5, "sized_tail": True}, "scenario.sized_tail sizes a window"),
])
def test_more_bad_serve_input_is_refused_in_one_line(options, message):
    why = serve.refusal(options, lm=False)
    assert why is not None and message in why and "\n" not in why


def test_serve_without_a_path_is_refused_before_any_work():
    from fxtrack.frameworks.declaration import declaration
    from fxtrack.scenarios import rules

    torch = declaration("fxtrack.frameworks.torch")
    runtime = rules.Combination("torch", "serve", "fp32", runtime="onnxruntime", family="vit")
    assert rules.refusal(runtime, torch).startswith(
        "scenario=serve with runtime=onnxruntime is not supported by torch: scenario=serve")
    custom = rules.Combination("torch", "serve", "fp32", family="custom")
    assert "scenario=serve is not supported for model=custom" in rules.refusal(custom, torch)
    assert rules.refusal(rules.Combination("torch", "serve", "fp32", family="vit"), torch) is None


def test_the_sweeps_closing_table_gives_each_serve_jobs_max_rate():
    from fxtrack.scenarios.serve.section import closing_table

    def job(name, rate, stop):
        return {"name": name, "status": "FINISHED",
                "tags": {"fxtrack.scenario": "serve", "fxtrack.serve_search_stop": stop},
                "metrics": {"max_rate_under_slo_rps": rate, "lowest_failing_rate_rps": rate * 1.25,
                            "goodput_rps": rate * 0.9, "serve_recompiles": 0.0}}

    table = closing_table([job("torch-llama-serve", 32.0, "saturated"),
                           job("jax-llama-serve", 128.0, "slo"),
                           {"name": "train", "status": "FINISHED", "tags": {}, "metrics": {}}],
                          [])
    assert "0.25x" in table and "1.00x" in table and "saturated" in table and "40.00" in table
    assert "train" not in table and closing_table([], []) == ""
