"""Host load: the arithmetic of other processes' share, and a real busy loop seen as contention."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from fxtrack.measure import load


def _fake_proc(monkeypatch, samples):
    """Feed LoadSampler successive (seconds, busy ticks, steal ticks, own ticks) snapshots."""
    it = iter(samples)

    class Snap:
        def __init__(self, cpus, sid):
            self.t, self.busy, self.steal, self.own = next(it)

    monkeypatch.setattr(load, "_Snapshot", Snap)
    monkeypatch.setattr(load, "_HZ", 100)


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
