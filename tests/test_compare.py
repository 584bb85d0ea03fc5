"""``fxtrack compare`` on real tiny runs (a candidate that truly does more work per step, and two
sets of the same config), its direction rules and the trend chart on hand-made frames."""

from __future__ import annotations

import pandas as pd
import pytest

mlflow = pytest.importorskip("mlflow")

from conftest import run_fxtrack, seed_peak_cache  # noqa: E402
from fxtrack.report import compare, samples, trend  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated_store")  # a --log run's spool entry

# One intra-op thread: on a shared 2-core machine a 2-thread pool waits on whichever core is
# busy elsewhere, which spreads a tiny step's time over 4x between repeats; one thread is steady.
TINY = ["framework=torch", "model=vit", "size=tiny", "steps=5", "warmup_steps=1", "hardware=cpu",
        "hardware.cpu_threads=1"]
BATCH2 = "params.batch_size = '2' and params.seed = '0'"
BATCH64 = "params.batch_size = '64'"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Batch 2 with seed 0 and seed 1 (the same config twice: the seed changes the weights, not
    the work), interleaved round-robin in one sweep so that load on the machine hits both alike,
    then batch 64 with seed 0: 32 times the samples per step, a step time that is truly longer.
    Three repeats each, so every figure has an interval."""
    cwd = tmp_path_factory.mktemp("compare")
    env = seed_peak_cache(cwd / "cache")
    _seed_one_thread(cwd / "cache" / "peak_flops.json")
    for args in (["-m", *TINY, "batch_size=2", "seed=0,1", "repeats=3"],
                 [*TINY, "batch_size=64", "seed=0", "repeats=3"]):
        proc = run_fxtrack(cwd, *args, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return f"sqlite:///{cwd / 'mlflow.db'}"


def _seed_one_thread(path):
    """The seeded peak for one thread too (the cache is keyed by thread count)."""
    import json

    from fxtrack.measure import peak

    cache = json.loads(path.read_text())
    cache[peak.cache_key("cpu", "fp32", 1)] = cache[peak.cache_key("cpu", "fp32", peak.thread_count(None))]
    path.write_text(json.dumps(cache))


def run(capsys, *args):
    code = compare.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_slower_candidate_is_a_regression_and_fails_ci_past_the_threshold(store, tmp_path, capsys):
    code, out, err = run(capsys, "--uri", store, "--baseline", BATCH2, "--candidate", BATCH64,
                         "--metric", "step_time_ms_p50", "--fail-above", "5",
                         "--out", str(tmp_path / "cmp"))
    assert code == 1, out + err
    assert "step_time_ms_p50 (lower is better)" in out
    csv = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    (pair,) = csv[csv["verdict"] == "regression"].itertuples()
    assert pair.baseline_n == 3 and pair.candidate_n == 3
    assert pair.ratio > 1.05 and 1.0 < pair.ratio_ci_low < pair.ratio < pair.ratio_ci_high
    assert pair.change_pct == pytest.approx((pair.ratio - 1) * 100)
    assert "1 regression(s) larger than 5%" in out
    assert "batch_size" not in pair._fields  # the filters select on it: not part of the pairing
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| regression |" in md and pair.baseline_runs[:8] in md  # cites the runs

    above = f"{pair.change_pct * 2:.0f}"  # a threshold above the change: CI passes ...
    code, out, _ = run(capsys, "--uri", store, "--baseline", BATCH2, "--candidate", BATCH64,
                       "--metric", "step_time_ms_p50", "--fail-above", above)
    assert code == 0 and f"0 regression(s) larger than {above}%" in out
    assert "regression" in out.split("Candidate vs baseline")[1]  # ... the verdict stays


def test_the_same_config_twice_is_no_regression_and_unpaired_configs_are_listed(store, tmp_path, capsys):
    # Filters on the seed: batch 2 pairs with batch 2; batch 64 exists on the baseline side only.
    code, out, err = run(capsys, "--uri", store, "--baseline", "params.seed = '0'",
                         "--candidate", "params.seed = '1'", "--metric", "step_time_ms_p50",
                         "--threshold", "25", "--fail-above", "5", "--log", "--out",
                         str(tmp_path / "c"))
    assert code == 0, out + err
    # the terminal wraps its tables to 100 columns; compare.md holds each row on one line
    out = (tmp_path / "c" / "compare.md").read_text()
    table = out.split("Candidate vs baseline")[1].split("Configs on one side only")[0]
    rows = [line for line in table.splitlines() if "vit train fp32" in line]
    assert len(rows) == 1 and "no clear difference" in rows[0] and "batch_size=2" in rows[0]
    only = out.split("Configs on one side only (not compared)")[1]
    assert "baseline" in only and "batch_size=64" in only

    client = mlflow.MlflowClient(store)
    exp = client.get_experiment_by_name(compare.COMPARISONS)
    (logged,) = client.search_runs([exp.experiment_id])
    assert logged.data.tags["fxtrack.kind"] == "comparison"
    assert "fxtrack.framework" not in logged.data.tags  # never read back as a benchmark
    assert logged.data.metrics["pairs"] == 1 and logged.data.metrics["unpaired"] == 1
    assert logged.data.metrics["regressions"] == 0
    assert logged.data.params["candidate"] == "params.seed = '1'"
    assert {a.path for a in client.list_artifacts(logged.info.run_id)} == {"compare.md", "compare.csv"}


def test_bad_filter_or_unknown_metric_direction(store, capsys):
    code, _, err = run(capsys, "--uri", store, "--baseline", "params.oops ===", "--candidate", BATCH64)
    assert code == 2 and "baseline: invalid filter" in err
    with pytest.raises(SystemExit):
        compare.main(["--uri", store, "--baseline", BATCH2, "--candidate", BATCH64,
                      "--metric", "my_score"])
    assert "which way is better for 'my_score'" in capsys.readouterr().err


# --- synthetic frames: direction, filters, aggregates ----------------------------------------

T0 = pd.Timestamp("2026-01-01", tz="UTC")


def _frame(sides: dict[str, dict[str, list[float]]], version: dict[str, str] | None = None) -> pd.DataFrame:
    """side -> metric -> values: one repeats=N run per side (a repeat per value, then their
    aggregate: repeats pool only in their group), the same torch/vit config, a side told apart
    by params.side."""
    import statistics

    rows, n = [], 0
    for side, metrics in sides.items():
        count = len(next(iter(metrics.values())))
        for i in [*range(count), None]:  # the repeats, then the aggregate (their median)
            n += 1
            group = ({"tags.fxtrack.repeat_of": f"agg-{side}"} if i is not None else
                     {"tags.fxtrack.kind": "aggregate", "tags.fxtrack.result_id": f"agg-{side}",
                      "tags.fxtrack.repeats": str(count)})
            rows.append({"run_id": f"{side}{'agg' if i is None else i}", "status": "FINISHED",
                         "start_time": T0 + pd.Timedelta(days=n),
                         "tags.fxtrack.framework": "torch", "tags.fxtrack.model": "vit",
                         "tags.fxtrack.scenario": "train", "tags.fxtrack.precision": "fp32",
                         "tags.fxtrack.devices": "1", "tags.fxtrack.hardware": "cpu",
                         "tags.fxtrack.status": "ok", "params.batch_size": "2", "params.side": side,
                         "tags.fxtrack.framework_version": (version or {}).get(side, "2.13.0"),
                         **group,
                         **{f"metrics.{k}": (statistics.median(v) if i is None else v[i])
                            for k, v in metrics.items()}})
    return pd.DataFrame(rows)


def _one(frame: pd.DataFrame, metric: str) -> compare.Pair:
    ident = samples.identity_columns(frame, "params.side = 'a'")
    result = compare.compare(frame[frame["params.side"] == "a"], frame[frame["params.side"] == "b"],
                             metric, samples.lower_is_better(metric), ident)
    (pair,) = result.pairs
    return pair


def test_direction_flips_for_lower_is_better_metrics():
    frame = _frame({"a": {"throughput_samples_per_s": [100.0, 101.0, 99.0], "step_time_ms_p50": [20.0, 20.2, 19.8],
                          "peak_rss_mib": [500.0, 502.0, 498.0]},
                    "b": {"throughput_samples_per_s": [80.0, 81.0, 79.0], "step_time_ms_p50": [25.0, 25.2, 24.8],
                          "peak_rss_mib": [400.0, 401.0, 399.0]}})
    assert samples.lower_is_better("step_time_ms_p50") and samples.lower_is_better("peak_mem_device_mib")
    assert samples.lower_is_better("latency_ms_p90") and samples.lower_is_better("cost_per_1m_samples")
    assert not samples.lower_is_better("throughput_samples_per_s") and not samples.lower_is_better("mfu")
    slower = _one(frame, "throughput_samples_per_s")  # fewer samples/s: worse
    assert slower.ratio == pytest.approx(0.8) and slower.verdict == "regression"
    longer = _one(frame, "step_time_ms_p50")  # a longer step: worse
    assert longer.ratio == pytest.approx(1.25) and longer.verdict == "regression"
    smaller = _one(frame, "peak_rss_mib")  # less memory: better
    assert smaller.ratio == pytest.approx(0.8) and smaller.verdict == "improvement"
    assert compare.verdict(0.8, (0.7, 0.9), lower_better=False, threshold_pct=25) == "no clear difference"
    assert compare.verdict(0.8, (0.5, 1.1), lower_better=False, threshold_pct=2) == "no clear difference"
    assert compare.verdict(0.8, None, lower_better=False, threshold_pct=2) == (
        "regression (single runs: no interval)")


def test_filters_keys_leave_the_identity_and_aggregates_give_intervals():
    assert samples.selected_keys("tags.`fxtrack.model` = 'vit' and params.batch_size = '2' "
                                 "and attributes.start_time > 0") == {
        "tags.fxtrack.model", "params.batch_size", "attributes.start_time"}
    frame = _frame({"a": {"throughput_samples_per_s": [1.0]}})
    assert "batch_size" not in samples.identity_columns(frame, "params.batch_size = '2'")
    assert "model" not in samples.identity_columns(frame, "tags.`fxtrack.model` = 'vit'")
    assert "batch_size" in samples.identity_columns(frame, "tags.`fxtrack.framework_version` = '2.13.0'")

    # An aggregate without its repeats in the frame: the step-time interval it logged is inverted
    # back to log mean and sd, giving the same interval as the repeats' own values.
    from fxtrack import stats
    from fxtrack.orchestrator import repeats

    values = [20.0, 21.0, 23.0]
    agg = repeats.aggregate_metrics([{"step_time_ms_p50": v, "throughput_samples_per_s": 100 / v}
                                     for v in values])
    row = pd.Series({"run_id": "agg", **{f"metrics.{k}": v for k, v in agg.items()}})
    s = samples._from_aggregate(row, "step_time_ms_p50", pd.DataFrame([row]))
    mean, sd, n = stats.log_summary(values)
    assert s.log == pytest.approx((mean, sd, n)) and s.point == 21.0
    t = samples._from_aggregate(row, "throughput_samples_per_s", pd.DataFrame([row]))
    assert t.log == pytest.approx(stats.log_summary([100 / v for v in values]))


def test_trend_chart_over_framework_versions(tmp_path):
    frame = _frame({"a": {"throughput_samples_per_s": [100.0, 102.0, 98.0]},
                    "b": {"throughput_samples_per_s": [80.0, 82.0, 79.0]}},
                   version={"a": "2.12.0", "b": "2.13.0"})
    frame = frame.drop(columns="params.side")  # one config, measured at two versions
    (series,) = trend.points(frame).values()
    (points,) = series.values()
    assert [p[1] for p in points] == ["2.12.0", "2.13.0"]
    assert points[1][2].point == 80.0 and points[1][2].interval()[0] < 80.0
    (chart,) = trend.charts(frame, tmp_path)
    assert chart.path.is_file() and "Trend of throughput_samples_per_s" in chart.title
    assert trend.charts(frame[frame["tags.fxtrack.framework_version"] == "2.13.0"], tmp_path) == []
