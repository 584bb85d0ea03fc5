"""scenario.concurrency=search (issue 62 item 4): the most closed-loop clients whose requests meet
the SLOs, by the rate's bracket search, each probe a child run."""

from __future__ import annotations

import math

import pytest

from fxtrack.scenarios.serve import ServeOptions
from fxtrack.scenarios.serve import runner as serve


def test_the_search_brackets_a_known_number_of_clients():
    found = serve.search_concurrency(lambda c: c <= 13, start=4, resolution=0.1, max_clients=64)
    assert found.max_rate_rps == 13 and found.lowest_failing_rps == 14
    assert [c for c, _ in found.probes][:3] == [4, 8, 16]  # doubling from the start, then bisecting
    assert all(isinstance(c, int) for c, _ in found.probes)  # whole clients only
    none = serve.search_concurrency(lambda c: False, start=4, resolution=0.25, max_clients=64)
    assert none.max_rate_rps == 0 and none.lowest_failing_rps == 1  # halved down to one client
    every = serve.search_concurrency(lambda c: True, start=4, resolution=0.25, max_clients=20)
    assert every.max_rate_rps == 20 and math.isinf(every.lowest_failing_rps)


def test_a_closed_loop_past_its_capacity_fails_the_slo_and_the_search_stops_below_it():
    """A fake server of fixed service time: with C clients and batches of 2, a request waits
    for about C / 2 batches, so an E2E SLO of 5.5 batches holds up to 10 clients (11 wait 6 batches)."""
    from test_serve import VirtualClock, fake_server

    slo = {"ttft_ms": None, "tpot_ms": None, "e2e_ms": 55.0}

    def probe(clients, n):
        clock = VirtualClock()
        reqs = serve.serve_window(fake_server(clock, 0.01, 0.0), max_batch=2, max_wait_ms=0.0,
                                  buckets=[2], tokens=[1] * n, concurrency=int(clients),
                                  clock=clock, sleep=clock.sleep)
        w = serve.Window(None, reqs, serve.request_metrics(reqs, slo, False, None),
                         concurrency=int(clients))
        w.verdict = serve.probe_verdict(w.figures, slo)
        return w

    probes, best, lowest, reported = serve.search_windows(
        probe, 2, 0.1, 200, find=lambda passes: serve.search_concurrency(passes, 2, 0.1, 200))
    assert best == 10 and lowest == 11, [(w.concurrency, w.verdict) for w in probes]
    assert reported.concurrency == 10 and reported.verdict == "pass"
    assert {w.verdict for w in probes} == {"pass", "slo"}


@pytest.mark.parametrize("options, message", [
    ({"concurrency": "search"}, "concurrency=search needs an SLO"),
    ({"concurrency": "some", "slo": {"e2e_ms": 10}}, "number of clients or 'search'"),
    ({"concurrency": "2.5"}, "number of clients"),
    ({"concurrency": "0"}, "positive"),
])
def test_bad_concurrency_is_refused_in_one_line(options, message):
    try:
        why = ServeOptions(**options).refusal(lm=True)
    except ValueError as e:
        why = str(e)
    assert why is not None and message in why and "\n" not in why


@pytest.mark.parametrize("framework", ["torch", pytest.param("jax", marks=pytest.mark.slow)])
def test_a_tiny_concurrency_search_logs_each_probe_as_a_child_run(framework, tmp_path):
    """Tiny Llama through ``python -m fxtrack``: the parent keeps the answer, each probe is a
    child run of its clients, counted in its search by the report."""
    pytest.importorskip("mlflow")
    pytest.importorskip(framework)
    from conftest import report_here, run_fxtrack, seed_peak_cache
    from test_serve import search_and_probes

    env = seed_peak_cache(tmp_path / "cache")
    proc = run_fxtrack(tmp_path, "scenario=serve", f"framework={framework}", "model=llama",
                       "size=tiny", "hardware=cpu", "scenario.concurrency=search",
                       "scenario.slo.e2e_ms=10", "scenario.num_requests=16",
                       "scenario.prompt_len=8", "scenario.new_tokens=3", "scenario.max_batch=2",
                       "warmup_steps=1", env=env)
    _, parent, probes = search_and_probes(tmp_path, proc)
    assert parent.data.tags["fxtrack.serve_mode"] == "closed"
    clients = {}
    for r in probes:
        assert r.data.tags["fxtrack.serve_probe_of"] == parent.data.tags["fxtrack.result_id"]
        assert "-clients" in r.data.tags["mlflow.runName"]
        assert r.data.tags["fxtrack.serve_outputs"] == "match"
        assert "requested_rate_rps" not in r.data.metrics  # a closed loop: no rate asked for
        c = int(r.data.tags["mlflow.runName"].rsplit("-clients", 1)[1])
        clients[c] = r.data.tags["fxtrack.serve_probe"]
    m = parent.data.metrics
    passing = [c for c, verdict in clients.items() if verdict == "pass"]
    failing = [c for c, verdict in clients.items() if verdict != "pass"]
    assert m["max_concurrency_under_slo"] == max(passing, default=0)
    if failing:
        assert m["lowest_failing_concurrency"] == min(failing)
    else:
        assert parent.data.tags["fxtrack.serve_search_stop"] == "max_clients"
        assert max(clients) == 16  # up to one client per request of a probe
    report = report_here(tmp_path, "--out", str(tmp_path / "rep"))
    assert report.returncode == 0, report.stderr[-2000:]
    assert f"{len(probes)} probes counted in their search" in (tmp_path / "rep" / "report.md").read_text()
