"""Inference percentiles sized (issue 62 item 5): scenario=inference logs the batches behind its
latency percentiles, tags a p90 / p99 on fewer than MLPerf's early-stopping minimum as serve
tags its p99 (the same rule, batching.undersized), and scenario.min_queries /
scenario.min_duration_s run the timed window on until both are met. Tiny ViT runs in the
worker, in-process, one thread."""

from __future__ import annotations

import time

import pytest
from conftest import job_spec

from fxtrack.measure.timer import time_steps
from fxtrack.scenarios.batching import min_queries_for
from fxtrack.scenarios.inference import InferenceOptions

INFERENCE = dict(scenario="inference", runner="fxtrack.scenarios.inference.runner:run", warmup_steps=1,
                 batch_size=2, cpu_threads=1)


def infer(tmp_path, steps, **options):
    from fxtrack.worker.__main__ import prepare_environment, run

    spec = job_spec("torch", "vit", tmp_path, steps=steps, options=options, **INFERENCE)
    prepare_environment(spec)
    result = run(spec)
    assert result.status == "FINISHED", result.error
    return result


def test_a_small_window_is_tagged_undersized_with_its_count(tmp_path):
    result = infer(tmp_path, steps=3)
    assert result.metrics["latency_percentile_queries"] == 3
    assert len(result.series["step_time_ms"]) == 3
    assert result.tags["latency_p99_min_queries"] == "459"
    assert result.tags["latency_p90_min_queries"] == "44"
    assert result.tags["latency_p99_undersized"] == "true"
    assert result.tags["latency_p90_undersized"] == "true"


@pytest.mark.slow  # 459 timed batches of the tiny ViT: about 3 s on one core
def test_min_queries_sizes_the_window_for_a_p99(tmp_path):
    """steps=3 asked, min_queries=459: the window runs 459 batches, every percentile is taken over
    them, and neither tail is undersized."""
    need = min_queries_for(99)
    result = infer(tmp_path, steps=3, min_queries=need)
    assert result.metrics["latency_percentile_queries"] == need
    assert len(result.series["step_time_ms"]) == need
    assert result.tags["latency_p99_undersized"] == "false"
    assert result.tags["latency_p90_undersized"] == "false"
    # the percentiles are the window's (latency_ms_* mirrors step_time_ms_*)
    assert result.metrics["latency_ms_p99"] == result.metrics["step_time_ms_p99"]


def test_between_the_two_minimums_only_the_p99_is_undersized(tmp_path):
    result = infer(tmp_path, steps=3, min_queries=min_queries_for(90))
    assert result.metrics["latency_percentile_queries"] == 44
    assert result.tags["latency_p90_undersized"] == "false"
    assert result.tags["latency_p99_undersized"] == "true"


def test_the_window_runs_until_both_minimums_are_met():
    """min_duration_s keeps a window of few, fast steps going; min_steps one of slow steps."""
    step = lambda: time.sleep(0.01)  # noqa: E731
    by_time = time_steps(step, 0, 2, show=False, min_steps=3, min_duration_s=0.15)
    assert by_time.window_s >= 0.15 and len(by_time.step_times_s) > 3
    by_count = time_steps(step, 0, 2, show=False, min_steps=8, min_duration_s=0.001)
    assert len(by_count.step_times_s) == 8
    plain = time_steps(step, 0, 2, show=False)  # neither asked: steps alone
    assert len(plain.step_times_s) == 2


@pytest.mark.parametrize("bad", [dict(min_queries=0), dict(min_duration_s=-1.0),
                                 dict(min_duration_s=float("inf"))])
def test_a_window_floor_that_is_not_positive_is_refused(bad):
    key = next(iter(bad))
    with pytest.raises(ValueError, match=f"scenario.{key} must be a"):
        InferenceOptions(**bad)


def test_the_keys_compose_and_reach_the_worker(tmp_path):
    """scenario.min_queries / min_duration_s as a user types them: composed by Hydra, checked,
    and in the JobSpec's options the worker reads; 0 refused in one line naming the key."""
    from hydra import compose, initialize_config_dir

    from fxtrack.cli import CONF_DIR
    from fxtrack.config import register
    from fxtrack.config.validate import ConfigError, validate
    from fxtrack.orchestrator.job import job_spec as make_spec

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        conf, arch = validate(compose(config_name="config", overrides=[
            "scenario=inference", "scenario.min_queries=459", "scenario.min_duration_s=2",
            "size=tiny", "hardware=cpu"]))
        options = make_spec(conf, arch, tmp_path).options
        assert (options.min_queries, options.min_duration_s) == (459, 2.0)
        with pytest.raises(ConfigError, match="scenario.min_queries must be a positive number"):
            validate(compose(config_name="config",
                             overrides=["scenario=inference", "scenario.min_queries=0"]))


def test_a_time_floor_over_several_processes_is_refused_before_the_build(tmp_path):
    """Each rank would end its window on its own clock, a step apart from the others (a DDP
    forward's collective then hangs): refused, pointing at scenario.min_queries."""
    from fxtrack.worker.__main__ import prepare_environment, run

    spec = job_spec("torch", "vit", tmp_path, steps=2, devices=2,
                    options={"min_duration_s": 1.0}, **INFERENCE)
    prepare_environment(spec)
    result = run(spec)
    assert result.status == "FAILED" and result.tags.get("unsupported") == "true"
    assert "scenario.min_duration_s with devices x hardware.nodes > 1" in result.error
    assert "scenario.min_queries" in result.error
    assert "step_time_ms_p50" not in result.metrics  # nothing was timed
