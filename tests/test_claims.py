"""``fxtrack claims``: the claims file is complete and valid, an empty store lists every claim as
not yet measured with a command that composes, and a tiny sweep's real runs give ratio claims a
verdict with an interval while absolute figures are not testable on this CPU."""

from __future__ import annotations

import itertools
import shlex

import pandas as pd
import pytest

mlflow = pytest.importorskip("mlflow")

from conftest import run_fxtrack, seed_peak_cache  # noqa: E402
from fxtrack.report import claims  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated_store")


def test_every_claim_has_a_source_conditions_and_a_kind():
    found = {c.id: c for c in claims.load()}
    assert len(found) >= 14
    for c in found.values():
        assert c.source["title"] and "section" in c.source, c.id
        assert set(claims.CONDITIONS) <= set(c.conditions), c.id
        assert c.kind in claims.KINDS and c.test in claims.TESTS and c.claim, c.id
        assert len(c.arms) >= 2, c.id
    # The published figures, as the sources print them.
    seed = found["seed-resnet50-train-a100"]
    assert [(a["framework"], a["value"]) for a in seed.arms] == [
        ("torch", 312), ("tensorflow", 287), ("jax", 345)]
    assert seed.conditions["device"] == "A100 80GB" and seed.conditions["framework_versions"] == {
        "torch": "1.13", "tensorflow": "2.10", "jax": "0.4.12"}
    assert claims.expected_ratio(found["seed-bert-train-tf-vs-torch"], 1)[0] == pytest.approx(12.4 / 11.7)
    assert [a["value"] for a in found["seed-vit-large-train-memory"].arms] == [52.7, 48.2, 45.1]
    assert [a["value"] for a in found["nvidia-dle-resnet50-train-a100"].arms] == [2470, 938, 2375]
    assert [a["value"] for a in found["keras3-bert-fit-a100"].arms] == [693, 202, 214, 222, 809]
    assert claims.expected_ratio(found["seed-fsdp-memory"], 4)[0] == 0.25  # 1/N at N = 4
    assert found["seed-jax-pmap-8gpu"].ratio == 5.8 and found["seed-tflite-model-size"].ratio == 0.25
    # Printed precision: 312 means 311.5-312.5; 1.15 means 1.145-1.155.
    assert claims._half_unit(312) == 0.5 and claims._half_unit(1.15) == pytest.approx(0.005)


def test_a_claim_without_source_or_conditions_is_rejected(tmp_path):
    bad = tmp_path / "claims.yaml"
    bad.write_text("- id: x\n  claim: fast\n  kind: ratio\n  metric: throughput_samples_per_s\n"
                   "  arms: [{framework: jax}, {framework: torch}]\n  ratio: 1.1\n  test: anywhere\n")
    with pytest.raises(ValueError, match="missing source, conditions"):
        claims.load(bad)
    bad.write_text(bad.read_text().replace("  test:", "  source: {title: t, section: s}\n"
                                           "  conditions: {model: vit}\n  test:"))
    with pytest.raises(ValueError, match="conditions need"):
        claims.load(bad)


def test_a_claim_names_a_registered_metric_in_its_registered_unit(tmp_path):
    good = ("- id: x\n  claim: fast\n  kind: memory\n  metric: peak_rss_mib\n  unit: GB\n"
            "  source: {title: t, section: s}\n"
            "  conditions: {model: vit, scenario: train, hardware: null, device: null,\n"
            "    precision: null, batch_size: null, devices: 1, framework_versions: null}\n"
            "  arms: [{framework: jax, value: 2}, {framework: torch, value: 3}]\n"
            "  test: anywhere\n")
    path = tmp_path / "claims.yaml"
    path.write_text(good)
    assert claims.load(path)[0].scale() == pytest.approx(1e9 / 2**20)  # GB -> MiB
    path.write_text(good.replace("peak_rss_mib", "peak_rss_gb"))
    with pytest.raises(ValueError, match="'peak_rss_gb' is not a metric fxtrack logs"):
        claims.load(path)
    path.write_text(good.replace("peak_rss_mib", "step_time_ms_p50"))  # ms, not MiB
    with pytest.raises(ValueError, match="converts to MiB, but step_time_ms_p50 is in ms"):
        claims.load(path)


def test_an_empty_store_lists_every_claim_not_yet_measured_with_its_command(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # no database: nothing measured yet
    assert claims.main(["--uri", uri]) == 0
    out = capsys.readouterr().out
    # the table wraps to 100 columns (an id at its hyphens): each claim's row from its Table
    rows = {row[0]: row for row in claims.table(claims.verdicts(pd.DataFrame(), claims.load(), "cpu")).rows}
    for c in claims.load():
        assert rows[c.id][4] == "not yet measured", rows[c.id]
        assert f"to measure {c.id}:\n  " in out
    assert not (tmp_path / "mlflow.db").exists()


def test_plan_commands_are_valid_fxtrack_configs(tmp_path, capsys):
    """Every runnable line of --plan composes into a valid config (all of a sweep's jobs); a line
    this machine cannot run is a comment saying what it needs."""
    from hydra import compose, initialize_config_dir

    from fxtrack.config import register
    from fxtrack.orchestrator.app import validate
    from fxtrack.paths import CONF_DIR

    assert claims.main(["--uri", f"sqlite:///{tmp_path / 'none.db'}", "--plan"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    commands = [line for line in lines if line.startswith("python -m fxtrack ")]
    assert len(commands) >= 10
    assert all(line.startswith(("# needs", "# the ratio form", "# ")) for line in lines
               if not line.startswith("python"))
    assert any(line.startswith("# needs a GPU: python -m fxtrack") for line in lines)
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for line in commands:
            args = [a for a in shlex.split(line)[3:] if a != "-m"]
            sweeps = [[f"{k}={v}" for v in vs.split(",")] for k, vs in (a.split("=", 1) for a in args)]
            for job in itertools.product(*sweeps):
                conf, _ = validate(compose(config_name="config", overrides=list(job)))
                assert conf.repeats == claims.REPEATS, line


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A tiny ResNet-50 sweep on this CPU, torch and JAX, two repeats each (an interval)."""
    cwd = tmp_path_factory.mktemp("claims")
    # width 16: every block kind of tiny ResNet-50 at a sixteenth of its 25.6M parameters
    proc = run_fxtrack(cwd, "-m", "framework=torch,jax", "model=resnet50", "size=tiny",
                       "model.width=16", "steps=5",
                       "warmup_steps=1", "hardware=cpu", "batch_size=2", "repeats=2",
                       env=seed_peak_cache(cwd / "cache"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return f"sqlite:///{cwd / 'mlflow.db'}"


def test_a_tiny_sweep_gives_ratio_claims_verdicts_and_absolute_ones_not_testable(sweep, monkeypatch):
    from fxtrack.tracking import reader

    frame = reader.load_runs(sweep, "fxtrack")
    aggregates = set(frame.loc[frame["tags.fxtrack.kind"] == "aggregate", "run_id"])
    found = {v.claim.id: v for v in claims.verdicts(frame, machine="cpu")}

    ratio = found["seed-jax-resnet50-faster"]  # a ratio: checked on whatever hardware has runs
    assert ratio.status in (claims.CONSISTENT, claims.CONTRADICTED), ratio.detail
    assert "jax/torch is" in ratio.detail and "[" in ratio.detail and "published 1.15x" in ratio.detail
    assert "resnet50 tiny" in ratio.detail and "cpu" in ratio.detail  # named by its dims
    assert set(ratio.run_ids) == aggregates  # the two aggregates it stands on

    absolute = found["seed-resnet50-train-a100"]  # figures for an A100: not testable on a CPU
    assert absolute.status == claims.UNTESTABLE
    assert absolute.detail.startswith("needs a GPU (A100 80GB)")
    assert "jax/torch is" in absolute.detail and "published 1.11x" in absolute.detail  # 345 / 312
    nvidia = found["nvidia-dle-resnet50-train-a100"]  # AMP / TF32 arms: fp32 runs are neither
    assert nvidia.status == claims.UNMEASURED and any("precision=fp16" in c for c in nvidia.commands)
    assert found["seed-bert-train-tf-vs-torch"].status == claims.UNMEASURED
    assert any("model=bert" in c for c in found["seed-bert-train-tf-vs-torch"].commands)

    def unasked(*args):
        raise AssertionError("the report's section planned commands it does not show")

    monkeypatch.setattr(claims, "plan", unasked)  # a plan composes every cell: seconds per sweep
    section = claims.section(frame)  # the report's section: only claims the runs speak to
    (table,) = section.tables
    ids = [row[0] for row in table.rows]
    assert "seed-jax-resnet50-faster" in ids and "seed-bert-train-tf-vs-torch" not in ids
    assert all(row[-1] != "-" for row in table.rows)  # every verdict cites its runs


def _runs(values: dict[str, list[float]], hardware: str = "cpu", device: str = "cpu",
          model: str = "resnet50"):
    """One config per framework, in search_runs layout: several values are one repeats=N run
    (the repeats, then their aggregate: only a repeat group pools), one value a single run."""
    import statistics

    import pandas as pd

    t0 = pd.Timestamp("2026-01-01", tz="UTC")
    runs = [(fw, i, v) for fw in values for i, v in enumerate(values[fw])]
    runs += [(fw, "agg", statistics.median(values[fw])) for fw in values if len(values[fw]) > 1]

    def group(fw, i):
        if len(values[fw]) == 1:
            return {}
        if i == "agg":
            return {"tags.fxtrack.kind": "aggregate", "tags.fxtrack.result_id": f"agg-{fw}",
                    "tags.fxtrack.repeats": str(len(values[fw]))}
        return {"tags.fxtrack.repeat_of": f"agg-{fw}"}

    rows = [{"run_id": f"{fw}{i}", "status": "FINISHED", "start_time": t0 + pd.Timedelta(minutes=n),
             "tags.fxtrack.framework": fw, "tags.fxtrack.model": model,
             "tags.fxtrack.scenario": "train", "tags.fxtrack.precision": "fp32",
             "tags.fxtrack.devices": "1", "tags.fxtrack.hardware": hardware,
             "tags.fxtrack.device": device, "tags.fxtrack.status": "ok", "params.batch_size": "32",
             "params.size.name": "full", "metrics.throughput_samples_per_s": v, **group(fw, i)}
            for n, (fw, i, v) in enumerate(runs)]
    return pd.DataFrame(rows)


def test_verdicts_consistent_contradicted_and_on_the_claimed_device():
    found = {c.id: c for c in claims.load()}
    faster = found["seed-jax-resnet50-faster"]
    near = claims.evaluate(faster, _runs({"jax": [115.0, 116.0, 114.0], "torch": [100.0, 101.0, 99.0]}), "cpu")
    assert near.status == claims.CONSISTENT and "published 1.15x" in near.detail
    assert sorted(near.run_ids) == ["jaxagg", "torchagg"]  # each repeat group, by its aggregate
    far = claims.evaluate(faster, _runs({"jax": [200.0, 202.0, 198.0], "torch": [100.0, 101.0, 99.0]}), "cpu")
    assert far.status == claims.CONTRADICTED and "jax/torch is 2.00x [" in far.detail
    assert "74% above it" in far.detail  # 2.00 / 1.15 - 1
    single = claims.evaluate(faster, _runs({"jax": [115.0], "torch": [100.0]}), "cpu")
    assert single.status == claims.UNTESTABLE and "repeats=3" in single.detail

    a100 = found["seed-resnet50-train-a100"]
    on = {"hardware": "gpu", "device": "NVIDIA A100-SXM4-80GB"}
    ok = claims.evaluate(a100, _runs({"torch": [310.0, 312.0, 314.0], "tensorflow": [285.0, 287.0, 289.0],
                                      "jax": [343.0, 345.0, 347.0]}, **on), "gpu")
    assert ok.status == claims.CONSISTENT, ok.detail
    slow = claims.evaluate(a100, _runs({"torch": [250.0, 251.0, 249.0], "tensorflow": [285.0, 287.0, 289.0],
                                        "jax": [343.0, 345.0, 347.0]}, **on), "gpu")
    assert slow.status == claims.CONTRADICTED and "torch 250 [" in slow.detail and "(-20%)" in slow.detail
    other = claims.evaluate(a100, _runs({"torch": [250.0, 251.0, 249.0], "jax": [300.0, 301.0, 299.0]},
                                        hardware="gpu", device="NVIDIA H100 80GB HBM3"), "gpu")
    assert other.status == claims.UNTESTABLE and other.detail.startswith("needs an A100 80GB")
    assert "jax/torch is 1.20x [" in other.detail
