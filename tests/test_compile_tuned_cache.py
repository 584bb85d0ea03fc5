"""framework.compile=auto reuses an earlier framework.compile=tune pick (issue 35 item 2): the
pick is cached by the same function the tune path writes it with, keyed by machine, framework,
family, size keys, precision and batch; auto takes it for the matching config only, the table
elsewhere, and tags which; a corrupt cache file is ignored with a warning."""

from __future__ import annotations

import pytest
from conftest import job_spec
from test_compile_modes import SleepBackend, sleepy  # noqa: F401 -- the fake framework fixture

from fxtrack.worker.protocol import Result
from fxtrack.measure import tuned
from fxtrack.scenarios import timed


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    return tmp_path


def _auto_run(**overrides):
    fields = dict(package="sleepyfw", compile_request="auto", steps=2, warmup_steps=1)
    spec = job_spec("torch", "vit", **{**fields, **overrides})
    backend, result = SleepBackend(spec), Result(result_id="r")
    timed.build(backend, result)
    return spec, result


def _tune_pick(cache, **overrides):
    """A tune run's pick as the tune path stores it (its key, the cache's record function),
    without timing anything: the fake framework's table says eager, the pick says compiled."""
    spec = job_spec("torch", "vit", **{"package": "sleepyfw", **overrides})
    key = timed.tuned_key(SleepBackend(spec), "cpu", spec.batch_size)
    assert tuned.record(key, True, "fast-default=1.0ms;slow=30.0ms")
    return key


def test_auto_takes_the_cached_pick_for_the_matching_config(sleepy, cache):  # noqa: F811
    key = _tune_pick(cache)
    assert (cache / "compile_tuned.json").is_file() and tuned.lookup(key)["compiled"] is True
    spec, result = _auto_run()
    assert spec.compile is True and result.resolved["compile"] is True
    assert result.tags["compile_decision"] == "tuned"
    assert result.tags["compile_rule"].startswith("auto: tuned on this machine")
    assert "fast-default=1.0ms" in result.tags["compile_rule"]


@pytest.mark.parametrize("other", [dict(batch_size=4), dict(precision="bf16")])
def test_auto_uses_the_table_for_another_batch_or_precision(sleepy, cache, other):  # noqa: F811
    _tune_pick(cache)
    spec, result = _auto_run(**other)
    assert spec.compile is False  # the fake framework's table row: never
    assert result.tags["compile_decision"] == "table"
    assert result.tags["compile_rule"] == "auto: never"


def test_auto_uses_the_table_for_another_family_or_size(sleepy, cache):  # noqa: F811
    _tune_pick(cache)
    for spec in (job_spec("torch", "bert", package="sleepyfw", compile_request="auto"),
                 job_spec("torch", "vit", size="tiny", package="sleepyfw",
                          compile_request="auto", arch={"layers": 3})):
        result = Result(result_id="r")
        timed.build(SleepBackend(spec), result)
        assert spec.compile is False and result.tags["compile_decision"] == "table"


def test_tune_stores_its_pick_and_a_later_auto_reuses_it(sleepy, cache, monkeypatch):  # noqa: F811
    monkeypatch.setattr(SleepBackend, "SLEEP_S", {True: 0.001, False: 0.03})
    spec = job_spec("torch", "vit", package="sleepyfw", compile_request="tune", steps=2,
                    warmup_steps=1)
    result = Result(result_id="r")
    timed.build(SleepBackend(spec), result)
    assert spec.compile is True and result.tags["compile_decision"] == "tuned"
    (entry,) = tuned.cached().values()
    assert entry["compiled"] is True and entry["figures"] == result.tags["compile_tuned"]
    spec, result = _auto_run()
    assert spec.compile is True and result.tags["compile_decision"] == "tuned"


def test_forced_requests_are_tagged_asked(sleepy, cache):  # noqa: F811
    _tune_pick(cache)
    for request in ("true", "false"):
        spec, result = _auto_run(compile_request=request)
        assert spec.compile is (request == "true")
        assert result.tags["compile_decision"] == "asked"


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_a_corrupt_cache_is_ignored_with_a_warning(sleepy, cache, capsys, text):  # noqa: F811
    (cache / "compile_tuned.json").write_text(text)
    spec, result = _auto_run()
    assert spec.compile is False and result.tags["compile_decision"] == "table"
    assert "WARNING: ignoring the compile-mode cache" in capsys.readouterr().err
    # a tune's pick replaces the unreadable file instead of failing the run
    key = _tune_pick(cache)
    assert tuned.lookup(key)["compiled"] is True


def test_doctor_lists_the_cached_picks(sleepy, cache):  # noqa: F811
    from fxtrack.orchestrator.doctor import tuned_lines

    assert "none (run with framework.compile=tune" in tuned_lines()[0]
    key = _tune_pick(cache)
    header, line = tuned_lines()
    assert str(cache / "compile_tuned.json") in header
    assert line.startswith(f"  {key}: compile=true (fast-default=1.0ms;slow=30.0ms, tuned 20")
