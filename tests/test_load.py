"""Host load: the arithmetic of other processes' share, a real busy loop seen as contention, and
the timed windows that carry the figures (run_timed; the pipeline scenario's two windows)."""

from __future__ import annotations

import select
import subprocess
import sys
import time
import types

import pytest

from fxtrack.measure import host_load as load


def _fake_proc(monkeypatch, samples):
    """Feed LoadSampler successive (seconds, busy ticks, steal ticks, own ticks) snapshots."""
    it = iter(samples)

    class Snap:
        def __init__(self, cpus, sid, agent, children=False, pids=()):
            self.t, self.busy, self.steal, self.own = next(it)

    monkeypatch.setattr(load, "_Snapshot", Snap)
    monkeypatch.setattr(load, "_HZ", 100)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_torchrun_ranks_count_as_fxtracks_own_work(monkeypatch):
    """torchrun starts each rank in a session of its own: a rank's sampler counts its agent's
    children's sessions as fxtrack's, else 2 ranks on 2 cores see each other as 50% contention
    (measured on canonical BERT before the fix)."""
    import os

    rank = ("import time\nt = time.time()\nwhile time.time() - t < 3: pass")
    agent_code = ("import subprocess, sys\n"
                  f"ps = [subprocess.Popen([sys.executable, '-c', {rank!r}], start_new_session=True)"
                  " for _ in range(2)]\nprint('started', flush=True)\n[p.wait() for p in ps]")
    agent = subprocess.Popen([sys.executable, "-c", agent_code], stdout=subprocess.PIPE, text=True)
    try:
        assert agent.stdout.readline().strip() == "started"
        time.sleep(1.0)
        alone = load._session_ticks(os.getsid(0))
        with_ranks = load._session_ticks(os.getsid(0), agent=agent.pid)
    finally:
        agent.wait(timeout=30)
    assert with_ranks - alone >= 50  # two ranks spinning for ~1 s: ~200 ticks at 100 Hz
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    assert load.LoadSampler().agent == os.getppid()
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert load.LoadSampler().agent is None


def test_other_share_is_busy_minus_own_plus_steal(monkeypatch):
    # 4 cores, 2 s: 800 ticks of capacity. Busy 500 ticks, fxtrack's session 300, steal 40:
    # other = (500 - 300 + 40) ticks = 2.4 s of 8 core-seconds = 0.30.
    _fake_proc(monkeypatch, [(0.0, 1000, 10, 50), (2.0, 1500, 50, 350)])
    s = load.LoadSampler()
    s.cpus, s.threads, s.available = {0, 1, 2, 3}, 4, True
    with s:
        pass
    assert s.other_cpu_frac == pytest.approx(0.30)
    assert s.steal_frac == pytest.approx(0.40 / 8)
    assert s.contended and load.is_contended(0.11) and not load.is_contended(0.10)
    assert set(s.metrics()) == {"host_other_cpu_frac", "host_steal_frac", "host_loadavg_1m"}


def test_work_that_fits_on_spare_cores_does_not_count(monkeypatch):
    # 4 cores, fxtrack uses 2, 1 s: other work of 1.5 core-seconds fits the 2 spare cores -> 0;
    # 2.5 core-seconds leaves 0.5 on fxtrack's 2 cores -> 0.25.
    _fake_proc(monkeypatch, [(0.0, 0, 0, 0), (1.0, 150, 0, 0), (0.0, 0, 0, 0), (1.0, 250, 0, 0)])
    for expect in (0.0, 0.25):
        s = load.LoadSampler(threads=2)
        s.cpus, s.threads, s.available = {0, 1, 2, 3}, 2, True
        with s:
            pass
        assert s.other_cpu_frac == pytest.approx(expect)


def test_unreadable_proc_gives_no_figure(monkeypatch):
    s = load.LoadSampler()
    s.available = False
    with s:
        pass
    assert s.other_cpu_frac is None and s.metrics() == {} and not s.contended


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_busy_process_elsewhere_is_seen_and_our_own_work_is_not():
    # A bounded busy loop in a session of its own (as another user's job would be) takes about a
    # core: on any machine with <= 8 allowed cores that is well above the 10% threshold.
    cpus = len(load._cpus())
    if cpus > 8:
        pytest.skip("one busy core is under 10% of this many cores")
    busy = subprocess.Popen([sys.executable, "-c",
                             "import time\nt=time.time()\nwhile time.time()-t<3: pass"],
                            start_new_session=True)
    try:
        time.sleep(0.3)  # let it start spinning
        assert load.probe(1.0).other_cpu_frac > load.CONTENDED_FRAC
    finally:
        busy.kill()
        busy.wait()


# --- the timed window of a scenario, with a stand-in backend (no framework needed) -----------

class SpinBackend:
    """A backend whose step keeps this process busy for ``step_s``; a loader-fed step takes
    ``fed_s``. Enough of the Backend surface for run_timed and the pipeline scenario."""

    name = "spin"

    def __init__(self, spec, step_s: float = 0.05, fed_s: float = 0.05):
        from fxtrack import architectures

        self.spec, self.step_s, self.fed_s = spec, step_s, fed_s
        self.arch = architectures.resolve("vit", "tiny")
        self.loss = 10.0

    def _spin(self, seconds: float) -> float:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
        self.loss *= 0.9
        return self.loss

    def device_kind(self): return "cpu"
    def device_tags(self): return {}
    def build(self, batch_size): pass
    def train_step(self): return self._spin(self.step_s)
    def capability(self, name):  # the pipeline capability: an endless loader, a slower step
        assert name == "pipeline"
        return types.SimpleNamespace(loader=lambda backend, *args: iter(lambda: None, 1),
                                     train_step_on=lambda backend, batch: self._spin(self.fed_s))
    def param_count(self): return 1
    def reduce_max(self, value): return value
    def peak_memory(self): return None
    def loss_value(self, handle): return handle


@pytest.fixture
def one_cpu():
    """Pin this process (and what it starts) to one CPU, so a busy loop competes with it on
    any machine, however many cores it has."""
    if not hasattr(load.os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    before = load.os.sched_getaffinity(0)
    load.os.sched_setaffinity(0, {min(before)})
    yield
    load.os.sched_setaffinity(0, before)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_run_beside_a_busy_loop_is_tagged_contended(tmp_path, one_cpu):
    from conftest import job_spec
    from fxtrack.worker.protocol import Result
    from fxtrack.scenarios.timed import run_timed

    spec = job_spec("torch", "vit", tmp_path, steps=12, warmup_steps=1)
    busy = subprocess.Popen([sys.executable, "-c",
                             "import time\nt=time.time()\nwhile time.time()-t<20: pass"],
                            start_new_session=True)  # another user's job: not fxtrack's session
    try:
        time.sleep(0.3)
        result = Result(spec.result_id)
        backend = SpinBackend(spec, step_s=0.1)
        run_timed(backend, result, lambda: backend.train_step, 1)
    finally:
        busy.kill()
        busy.wait()
    m = result.metrics
    assert m["host_other_cpu_frac"] > load.CONTENDED_FRAC
    assert "host_other_cpu_frac_before" in m and "host_loadavg_1m" in m
    assert result.tags["contended"] == "true"
    from fxtrack.tracking import records  # the tag the MLflow run gets

    result.status = "FINISHED"
    record = records.job_record(spec, result, {}, "sqlite:///unused.db", "fxtrack", None, 0)
    assert record["tags"]["fxtrack.contended"] == "true"


def test_pipeline_standard_keys_describe_the_fed_window(tmp_path, monkeypatch):
    from conftest import job_spec
    from fxtrack.data import on_disk
    from fxtrack.worker.protocol import Result
    from fxtrack.scenarios.pipeline import runner as pipeline

    monkeypatch.setattr(on_disk, "ensure", lambda arch, samples, seed: tmp_path)
    spec = job_spec("torch", "vit", tmp_path, scenario="pipeline", steps=4, warmup_steps=1,
                    options={"dataset_samples": 8, "loader_workers": 0})
    # the fed step takes twice the resident one: input-bound ~ 0.5
    backend = SpinBackend(spec, step_s=0.01, fed_s=0.02)
    result = Result(spec.result_id)
    pipeline.run(backend, result)
    m = result.metrics
    fed_ms = result.series["step_time_ms"]
    assert len(fed_ms) == pipeline.ROUNDS * 4  # every fed round's steps, and only those
    assert m["step_time_ms_p50"] == pytest.approx(20, rel=0.5)  # the fed window's steps
    assert m["resident_step_time_ms_p50"] == pytest.approx(10, rel=0.5)
    # throughput and step time describe the same window: batch 2 / ~20 ms
    assert m["throughput_samples_per_s"] == pytest.approx(2 * 1000 / m["step_time_ms_mean"], rel=0.25)
    assert m["input_bound_fraction"] == pytest.approx(
        1 - m["throughput_samples_per_s"] / m["resident_samples_per_s"])
    assert 0.2 < m["input_bound_fraction"] < 0.8
    assert "first_step_time_s" in m and "resident_first_step_time_s" in m


def test_pipeline_input_bound_fraction_is_signed(tmp_path, monkeypatch):
    from conftest import job_spec
    from fxtrack.data import on_disk
    from fxtrack.worker.protocol import Result
    from fxtrack.scenarios.pipeline import runner as pipeline

    monkeypatch.setattr(on_disk, "ensure", lambda arch, samples, seed: tmp_path)
    spec = job_spec("torch", "vit", tmp_path, scenario="pipeline", steps=3, warmup_steps=1,
                    options={"dataset_samples": 8, "loader_workers": 0})
    result = Result(spec.result_id)
    pipeline.run(SpinBackend(spec, step_s=0.02, fed_s=0.01), result)  # fed runs faster
    assert result.metrics["input_bound_fraction"] < 0  # logged as measured, not clamped


def test_wait_for_idle_narrates_and_stops_when_quiet(monkeypatch):
    fracs = iter([0.5, 0.3, 0.02])

    def fake_probe(seconds=load.PROBE_S, threads=None):
        s = load.LoadSampler(threads)
        s.other_cpu_frac, s.available = next(fracs), True
        return s

    monkeypatch.setattr(load, "probe", fake_probe)
    said: list[str] = []
    last = load.wait_for_idle(30, say=said.append)
    assert last.other_cpu_frac == 0.02 and not last.contended
    assert "waiting up to 30 s" in said[0] and "machine quiet" in said[-1]
    monkeypatch.setattr(load, "probe", lambda seconds=0, threads=None: fake_busy())
    said.clear()

    def fake_busy():
        s = load.LoadSampler()
        s.other_cpu_frac, s.available = 0.9, True
        return s

    assert load.wait_for_idle(0.2, say=said.append).contended and "still busy" in said[-1]
    said.clear()
    load.wait_for_idle(0, say=said.append)  # no wait asked: one silent probe
    assert said == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_span_since_the_worker_started_replaces_the_probe_and_counts_the_orchestrator(
        one_cpu, monkeypatch):
    """Issue 61: the 0.5 s probe before the window (half of a tiny job's fixed cost) is the
    load sampled from the worker's start to its window; the orchestrator's CPU meanwhile
    (loading MLflow beside the build) is fxtrack's own, another process's is not. The
    "orchestrator" here is a busy loop given as that pid; another busy loop is competition."""
    def spin(seconds: float) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\n"
                                 f"while time.time()-t<{seconds}: pass"], start_new_session=True)

    slept = []
    monkeypatch.setattr(load.time, "sleep", lambda s: slept.append(s))  # no probe may sleep
    for counted_as_own, expect_contended in ((True, False), (False, True)):
        other = spin(1.5)
        try:
            load.start_sampling(None, other.pid if counted_as_own else None)
            select.select([], [], [], 1.0)  # the worker's build: this process idles here
            before = load.wait_for_idle(0.0)
        finally:
            other.kill()
            other.wait()
        assert before.window_s >= load.PROBE_S and not slept  # the span, not a probe
        assert before.contended == expect_contended, before.other_cpu_frac
    assert load.since_start() is None  # taken once: a later window probes
