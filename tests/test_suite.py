"""Across the suite (issue 62, item 1): from the page's own figures, AlgoPerf's performance
profile and each framework's geometric-mean ratio to the best over the cells, recomputed here
from the cells' figures; a missing cell named and scored at the cap; a team's own mix with
weights (--suite FILE)."""

from __future__ import annotations

import math

import pytest

from fxtrack.report import answer, suite
from tests.test_figures import Generator, log, search_frame

# (model, scenario) -> framework -> figure; jax never ran resnet50's training
TRAIN = {"vit": {"torch": 100.0, "jax": 50.0}, "bert": {"torch": 30.0, "jax": 60.0},
         "resnet50": {"torch": 20.0}}
INFER = {"vit": {"torch": 400.0, "jax": 200.0}, "bert": {"torch": 100.0, "jax": 100.0}}


def _store(repeats: int = 1):
    g = Generator(0)
    g.rng.random = lambda: 0.99  # no caveats
    for scenario, figures in (("train", TRAIN), ("inference", INFER)):
        for model, by_fw in figures.items():
            for fw, value in by_fw.items():
                values = [value * f for f in (0.9, 1.0, 1.1)][:repeats] if repeats > 1 else [value]
                g.group(fw, scenario, {}, values, "throughput_samples_per_s", {})
                for run in g.runs[-(len(values) + (len(values) > 1)):]:
                    run.tags["fxtrack.model"] = model
                    run.params["model.name"] = model
    return g


def _expected(figures: dict, fw: str) -> tuple[float, dict]:
    ratios = []
    for by_fw in figures.values():
        best = max(by_fw.values())
        ratios.append(best / by_fw[fw] if fw in by_fw else None)
    geo = math.exp(sum(math.log(suite.CAP if r is None else r) for r in ratios) / len(ratios))
    prof = {t: sum(r is not None and r <= t for r in ratios) / len(ratios) for t in suite.TAUS}
    return geo, prof


def test_the_profile_and_geomean_are_the_cells_figures_and_a_missing_cell_is_at_the_cap():
    blocks, _ = answer.blocks(search_frame(_store().runs))
    found = {s.objective: s for s in suite.suites(blocks)}
    assert set(found) == {"train", "inference"}
    for key, figures in (("train", TRAIN), ("inference", INFER)):
        assert len(found[key].cells) == len(figures)
        for standing in found[key].standings:
            geo, prof = _expected(figures, standing.framework)
            assert standing.geomean == pytest.approx(geo), (key, standing.framework)
            assert standing.profile == pytest.approx(prof), (key, standing.framework)
            assert standing.interval is None  # single runs: no uncertainty to carry
    jax = next(s for s in found["train"].standings if s.framework == "jax")
    assert jax.cells == 2 and len(jax.missing) == 1 and jax.missing[0].startswith("resnet50")
    table = suite.table(found["train"])
    assert "resnet50" in table.rows[[r[0] for r in table.rows].index("JAX")][-1]
    assert "A missing cell counts at the cap" in table.notes[0]


def test_repeats_give_an_interval_around_the_geomean():
    blocks, _ = answer.blocks(search_frame(_store(repeats=3).runs))
    (train,) = [s for s in suite.suites(blocks) if s.objective == "train"]
    for standing in train.standings:
        low, high = standing.interval
        assert low <= standing.geomean <= high and low < high
    again = [s for s in suite.suites(blocks) if s.objective == "train"][0]
    assert [s.interval for s in again.standings] == [s.interval for s in train.standings]


def test_a_teams_mix_weights_its_cells_and_a_bad_file_is_refused(tmp_path, capsys):
    from fxtrack.report.cli import main

    mix = tmp_path / "mix.yaml"
    mix.write_text("- {objective: train, model: vit, weight: 3}\n"
                   "- {objective: train, model: bert}\n")
    blocks, _ = answer.blocks(search_frame(_store().runs))
    (train,) = suite.suites(blocks, suite.read_weights(mix))
    jax = next(s for s in train.standings if s.framework == "jax")
    assert len(train.cells) == 2  # resnet50 left out of this mix
    assert jax.geomean == pytest.approx(math.exp((3 * math.log(2.0) + math.log(1.0)) / 4))
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {objective: train, weight: -1}\n")
    assert main(["--suite", str(bad), "--uri", "sqlite:///nowhere.db"]) == 2
    assert "weight must be a positive number" in capsys.readouterr().err


def test_the_report_leads_with_the_suite_in_every_format(tmp_path, capsys):
    from fxtrack.report.cli import main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    log(_store().runs, uri)
    assert main(["--uri", uri, "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "Across the suite: Training throughput (3 cells" in out
    md = (tmp_path / "r" / "report.md").read_text()
    page = (tmp_path / "r" / "index.html").read_text()
    assert md.index("Across the suite") < md.index("### Training throughput:")
    assert page.index("Across the suite") < page.index("Training throughput: vit")
    assert (tmp_path / "r" / "suite_train.png").stat().st_size > 5_000
