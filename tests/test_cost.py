"""Cost per sample: the formula, the config key, and the metric a real run logs with a price."""

from __future__ import annotations

import pytest

from fxtrack.measure import cost


def test_cost_per_million_is_the_price_of_the_devices_over_the_rate():
    # 2.5 per device-hour, 4 devices on each of 2 nodes, 1,000 samples/s:
    # 2.5 / 3600 s x 8 devices = 0.005556 per second; 1e6 samples take 1,000 s.
    assert cost.cost_per_million(2.5, 4, 2, 1000.0) == pytest.approx(2.5 / 3600 * 4 * 2 * 1e6 / 1000.0)
    assert cost.cost_per_million(3.6, 1, 1, 1e6) == pytest.approx(0.001)
    assert cost.cost_metrics(3.6, 1, 1, {"throughput_samples_per_s": 500.0, "tokens_per_s": 8000.0}) == {
        "cost_per_1m_samples": pytest.approx(2.0), "cost_per_1m_tokens": pytest.approx(0.125)}
    assert cost.cost_metrics(None, 1, 1, {"throughput_samples_per_s": 500.0}) == {}  # no price
    assert cost.cost_metrics(1.0, 1, 1, {"checkpoint_save_s": 1.0}) == {}  # no rate: absent
    with pytest.raises(ValueError):
        cost.cost_per_million(1.0, 1, 1, 0.0)


def test_price_per_hour_defaults_to_none_and_must_be_positive():
    from hydra import compose, initialize_config_dir

    from fxtrack.config import register
    from fxtrack.orchestrator.app import ConfigError, validate
    from fxtrack.paths import CONF_DIR

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        conf, _ = validate(compose(config_name="config", overrides=["hardware=cpu"]))
        assert conf.hardware.price_per_hour is None
        conf, _ = validate(compose(config_name="config", overrides=["hardware.price_per_hour=2.5"]))
        assert conf.hardware.price_per_hour == 2.5
        with pytest.raises(ConfigError, match="hardware.price_per_hour must be a positive number"):
            validate(compose(config_name="config", overrides=["hardware.price_per_hour=-1"]))


def test_a_priced_run_logs_its_cost_and_the_report_shows_it(tmp_path, capsys, isolated_store):
    mlflow = pytest.importorskip("mlflow")
    from conftest import run_fxtrack, seed_peak_cache

    from fxtrack.report import cli

    proc = run_fxtrack(tmp_path, "framework=torch", "model=vit", "size=tiny", "steps=5",
                       "warmup_steps=1", "hardware=cpu", "batch_size=2", "hardware.price_per_hour=3.6",
                       env=seed_peak_cache(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("fxtrack").experiment_id])
    m = run.data.metrics
    assert m["cost_per_1m_samples"] == pytest.approx(3.6 / 3600 * 1 * 1 * 1e6 / m["throughput_samples_per_s"])
    assert "cost_per_1m_tokens" not in m  # a ViT logs no tokens_per_s
    assert run.data.params["hardware.price_per_hour"] == "3.6"

    assert cli.main(["--uri", uri, "--out", str(tmp_path / "r"), "--format", "md", "--no-log"]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## Cost" in md and "cost / 1M samples" in md
    assert f"{m['cost_per_1m_samples']:,.2f}" in md
    capsys.readouterr()

    from fxtrack.report import compare  # the cost beside a comparison's figures, too
    everything = "tags.`fxtrack.framework` = 'torch'"
    assert compare.main(["--uri", uri, "--baseline", everything, "--candidate", everything]) == 0
    out = capsys.readouterr().out
    # the cost columns (their headers may wrap to fit 100 columns: "cost/1M" over "base")
    assert "cost/1M" in out and f"{m['cost_per_1m_samples']:,.4f}" in out
