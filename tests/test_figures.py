"""One figure for every place it appears (issue 58): from generated stores, every figure the
answer, the time-to-quality section and ``compare`` show equals the metric's declared rule over
exactly its identity's latest group, with its n and every caveat of the runs it stands on.

The store: a first afternoon's, from a seed: train runs single and in
repeat groups of different sizes (a later, thinner group after a fuller one), separate runs of
equal params, contended and noisy runs, serve searches with both batching policies and their
caveats, converge on mnist (single runs and a repeats=5 group, missed targets among them) and
on two user files, to two targets. Each run carries the real tag, param and metric keys.

``generate(seed)`` gives the runs and, independently of fxtrack's readers, what every figure
must be: per experiment and framework, the metric's declared rule over exactly the latest
group of that identity, its n and its caveats. ``search_frame(runs)`` lays the runs out as
``mlflow.search_runs`` does; ``log(runs, uri)`` writes them into a real MLflow store.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from typing import Optional

import math

import pandas as pd
import pytest

from fxtrack.report import answer, compare, samples, tables, verdicts
from fxtrack.scenarios.converge import section as converge

T0 = 1_796_000_000_000  # ms
FRAMEWORKS = ("torch", "tensorflow", "jax")
CONTENDED_P, NOISY_P = 0.2, 0.15
# settings each framework logs of its own: identity within it, never between frameworks
OWN_SETTINGS = {"torch": {"framework.compile_mode": "default"},
                "jax": {"framework.donate": "true"}}


@dataclasses.dataclass
class Run:
    run_id: str
    start: int
    tags: dict
    params: dict
    metrics: dict


@dataclasses.dataclass
class Expected:
    point: float
    n: int
    caveats: set


def _middle(times: list[Optional[float]]) -> tuple[Optional[float], str]:
    """MLPerf's rule, written apart from fxtrack's: 5+ runs, fastest and slowest dropped, a miss
    the slowest, a miss among the kept: no figure."""
    if len(times) < 5:
        return None, f"{len(times)} run(s): needs repeats=5"
    kept = sorted(times, key=lambda t: float("inf") if t is None else t)[1:-1]
    if any(t is None for t in kept):
        return None, f"{sum(t is None for t in kept)} of the kept runs missed the target"
    return sum(kept) / len(kept), ""


class Generator:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.runs: list[Run] = []
        # (objective key, experiment words) -> framework -> Expected
        self.expected: dict[tuple[str, str], dict[str, Expected]] = {}
        self.n = 0

    def _run(self, fw: str, scenario: str, params: dict, metrics: dict, tags: dict) -> Run:
        self.n += 1
        base = {"fxtrack.framework": fw, "fxtrack.model": "vit", "fxtrack.scenario": scenario,
                "fxtrack.precision": "fp32", "fxtrack.devices": "1", "fxtrack.hardware": "cpu",
                "fxtrack.device": "cpu", "fxtrack.status": "ok", "fxtrack.cpu": "Test EPYC",
                "fxtrack.result_id": f"res{self.n}", "mlflow.runName": f"{fw}-{scenario}-{self.n}"}
        every = {"size.name": "tiny", "framework.compile": "auto", "batch_size": "2",
                 "seed": str(self.rng.randint(0, 9)), "steps": "20", "timeout_s": "7200.0",
                 "hardware.cpu_threads": "2", **OWN_SETTINGS.get(fw, {})}
        run = Run(f"run{self.n:04d}", T0 + self.n * 1000, {**base, **tags}, {**every, **params},
                  metrics)
        self.runs.append(run)
        return run

    def group(self, fw: str, scenario: str, params: dict, values: list, metric: str,
              extra: dict, tags_each=lambda: {}) -> tuple[list[dict], set]:
        """One repeat group (len(values) > 1: repeats then their aggregate) or a single run;
        returns each run's tags and the caveats on the group."""
        caveats, tags_all = set(), []
        def one_tags():
            t = dict(tags_each())
            if self.rng.random() < CONTENDED_P:
                t["fxtrack.contended"] = "true"
                caveats.add("contended")
            return t
        if len(values) == 1:
            t = one_tags()
            m = dict(extra)
            if values[0] is not None:
                m[metric] = values[0]
            self._run(fw, scenario, params, m, t)
            tags_all.append(t)
            return tags_all, caveats
        of = f"agg{self.n + len(values) + 1}"
        for i, v in enumerate(values):
            t = {**one_tags(), "fxtrack.repeat_of": of, "fxtrack.repeat": str(i)}
            m = dict(extra)
            if v is not None:
                m[metric] = v
            self._run(fw, scenario, params, m, t)
            tags_all.append(t)
        have = [v for v in values if v is not None]
        # what every repeat shares (the data's digest), as repeats.aggregate_tags copies it
        agg_tags = {**tags_each(), "fxtrack.kind": "aggregate", "fxtrack.repeats": str(len(values))}
        if "contended" in caveats:  # as repeats.aggregate_tags marks it: any repeat contended
            agg_tags["fxtrack.contended"] = "true"
        if self.rng.random() < NOISY_P:
            agg_tags["fxtrack.noisy"] = "true"
            caveats.add("noisy")
        m = {"repeats": float(len(values)), **extra}
        if len(have) == len(values):
            m[metric] = statistics.median(have)
        run = self._run(fw, scenario, params, m, agg_tags)
        run.tags["fxtrack.result_id"] = of
        return tags_all, caveats

    def train(self, frameworks):
        for fw in frameworks:
            sizes = self.rng.choice([[1], [1, 1], [3], [3, 2], [1, 3], [2]])  # groups, in order
            for size in sizes:
                values = [round(self.rng.uniform(10, 100), 3) for _ in range(size)]
                _, caveats = self.group(fw, "train", {}, values, "throughput_samples_per_s",
                                        {"peak_rss_mib": 500.0})
            point = statistics.median(values)
            earlier = max(sizes[:-1], default=0)
            self.expected.setdefault(("train", ""), {})[fw] = Expected(
                point, size, caveats | ({"earlier"} if earlier > size else set()))

    def serve(self, frameworks):
        for fw in frameworks:
            best = None
            for policy in ("static", "continuous"):
                value = round(self.rng.uniform(5, 200), 2)
                tags = {"fxtrack.serve_batching": policy}
                cav = set()
                if self.rng.random() < 0.3:
                    tags["fxtrack.serve_rate_short"] = "true"
                    cav.add("rate short")
                if self.rng.random() < 0.3:
                    tags["fxtrack.serve_p99_undersized"] = "true"
                    cav.add("p99 from few requests")
                _, contended = self.group(fw, "serve", {"scenario.rate": "search",
                                                        "scenario.batching": policy},
                                          [value], "max_rate_under_slo_rps",
                                          {"goodput_rps": value}, lambda t=tags: t)
                if best is None or value > best.point:
                    best = Expected(value, 1, cav | contended)
            self.expected.setdefault(("serve", ""), {})[fw] = best

    def converge(self, frameworks, data: str, digest: str, target: str, where: str):
        params = {"data.name": data, "scenario.target": target, "scenario.metric": "accuracy",
                  "data.path": f"/somewhere/{self.rng.randint(0, 99)}/{digest}.npz"}
        for fw in frameworks:
            plan = self.rng.choice([[1], [1, 5], [5], [5, 1]])
            for size in plan:
                times = [None if self.rng.random() < 0.15 else round(self.rng.uniform(1, 30), 3)
                         for _ in range(size)]
                _, caveats = self.group(
                    fw, "converge", params, times, "time_to_target_s", {},
                    lambda: {"fxtrack.data_digest": digest})
                # reached_target on each run, as converge logs it
                for run in self.runs[-(size + (size > 1)):]:
                    if run.tags.get("fxtrack.kind") != "aggregate":
                        run.metrics["reached_target"] = float("time_to_target_s" in run.metrics)
                    else:
                        run.metrics["reached_target"] = 1.0
            point, why = _middle(times)
            if point is None:
                reached = [t for t in times if t is not None]
                if not reached:
                    continue  # no figure at all: no entry
                point = statistics.median(reached)
                caveats = caveats | {why}
            earlier = max(plan[:-1], default=0)
            self.expected.setdefault(("quality", where), {})[fw] = Expected(
                point, size, caveats | ({"earlier"} if earlier > size else set()))


def generate(seed: int) -> Generator:
    g = Generator(seed)
    fws = list(FRAMEWORKS)
    g.rng.shuffle(fws)
    g.train(fws[:g.rng.choice([2, 3])])
    g.serve(fws[:2])
    g.converge(fws, "mnist", "mnistdigest00001", "0.8", "target 0.8")
    g.converge(fws[:2], "mnist", "mnistdigest00001", "0.5", "target 0.5")
    # two user files: each framework on its own file, never one block
    g.converge(fws[:1], "file", "aaaa1111bbbb2222", "0.8", "aaaa1111")
    g.converge(fws[1:2], "file", "cccc3333dddd4444", "0.8", "cccc3333")
    return g


def search_frame(runs: list[Run]) -> pd.DataFrame:
    """The runs as ``mlflow.search_runs`` lays them out (newest first, as it returns them)."""
    rows = []
    for r in runs:
        row = {"run_id": r.run_id, "status": "FINISHED",
               "start_time": pd.Timestamp(r.start, unit="ms", tz="UTC"),
               "end_time": pd.Timestamp(r.start + 500, unit="ms", tz="UTC")}
        row.update({f"tags.{k}": v for k, v in r.tags.items()})
        row.update({f"params.{k}": str(v) for k, v in r.params.items()})
        row.update({f"metrics.{k}": float(v) for k, v in r.metrics.items()})
        rows.append(row)
    return pd.DataFrame(rows).iloc[::-1].reset_index(drop=True)


def log(runs: list[Run], uri: str, experiment: str = "fxtrack") -> dict[str, str]:
    """The runs into a real MLflow store at ``uri``; generated id -> MLflow run id."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment(experiment)
    ids = {}
    for r in runs:
        run = client.create_run(exp, start_time=r.start, tags=r.tags,
                                run_name=r.tags.get("mlflow.runName"))
        rid = run.info.run_id
        client.log_batch(rid, params=[mlflow.entities.Param(k, str(v)) for k, v in r.params.items()],
                         metrics=[mlflow.entities.Metric(k, float(v), r.start, 0)
                                  for k, v in r.metrics.items()])
        client.set_terminated(rid, "FINISHED", end_time=r.start + 500)
        ids[r.run_id] = rid
    return ids


# -- the tests

SEEDS = range(8)


def _blocks(frame):
    blocks, missing = answer.blocks(frame)
    out = {}
    for b in blocks:
        key = b.objective.key
        if key == "quality":
            held = b.held
            words = (f"target {held['scenario.target']}" if held["data.name"] == "mnist"
                     else held["data_digest"][:8])
            out[(key, words)] = b
        elif key in ("train", "serve"):
            out[(key, "")] = b
    return out, missing


def _marks(sample) -> set:
    return set(sample.caveats) | ({"earlier"} if sample.earlier else set())


@pytest.mark.parametrize("seed", SEEDS)
def test_every_figure_is_its_rule_over_its_identitys_latest_group(seed):
    g = generate(seed)
    frame = search_frame(g.runs)
    blocks, _ = _blocks(frame)
    for where, want in g.expected.items():
        if not want:
            continue
        block = blocks[where]
        got = {e.framework: e.sample for e in block.entries}
        assert set(got) == set(want), (where, got, want)
        for fw, expected in want.items():
            s = got[fw]
            assert s.point == pytest.approx(expected.point), (seed, where, fw)
            assert s.n == expected.n, (seed, where, fw)
            assert _marks(s) == expected.caveats, (seed, where, fw)
        # the block's sentence carries every caveat its figures carry
        words = answer.sentence(block)
        for caveat in block.caveats:
            assert (caveat in words) or (caveat == "contended" and "Contended" in words)
    # nothing else made a block of its own
    assert {k for k in blocks if k[0] in ("train", "serve", "quality")} == {
        k for k, v in g.expected.items() if v}


@pytest.mark.parametrize("seed", SEEDS)
def test_the_section_and_compare_show_the_answers_figures(seed):
    g = generate(seed)
    frame = search_frame(g.runs)
    blocks, _ = _blocks(frame)
    # the time-to-quality section: the same figure, n and caveats per framework and experiment
    for where, figures in converge.groups(frame):
        words = (f"target {where['scenario.target']}" if where["data.name"] == "mnist"
                 else where["data_digest"][:8])
        want = g.expected[("quality", words)]
        shown = {name: f for name, f in figures if not math.isnan(f.point)}
        assert set(shown) == set(want), (seed, words)
        block = {e.framework: e.sample for e in blocks[("quality", words)].entries}
        for fw, f in shown.items():
            assert (f.point, f.n, _marks(f)) == (block[fw].point, block[fw].n, _marks(block[fw]))
    # compare, the same store on both sides: each pair's side is the answer's figure
    cols = samples.identity_columns(frame)
    result = compare.compare(frame, frame, "throughput_samples_per_s", False, cols)
    train = {e.framework: e.sample for e in blocks[("train", "")].entries}
    assert sorted(p.base.point for p in result.pairs) == sorted(s.point for s in train.values())
    assert sorted(p.base.n for p in result.pairs) == sorted(s.n for s in train.values())


def _throughput_cells(frame) -> dict[str, tuple[str, int]]:
    """The report's Throughput table (its one model's row) and the Verdict table's repeats
    column, as the report builds them: framework -> (figure as shown, repeats)."""
    runs = samples.standing(frame).runs
    train = runs[runs["scenario"] == "train"]
    (table,) = tables.throughput(train)
    (row,) = table.rows
    (verdict,) = verdicts.table(train) or [None]
    n = {r.framework: r.repeats for r in verdicts.ratios(train)}
    assert verdict is None or verdict.rows[0][-2] == str(min(n.values()))
    return {fw: (cell.split(" ")[0], n[fw]) for fw, cell in zip(table.header[1:], row[1:])}


@pytest.mark.parametrize("seed", SEEDS)
def test_the_throughput_and_verdict_tables_show_the_answers_figures(seed):
    frame = search_frame(generate(seed).runs)
    blocks, _ = _blocks(frame)
    block = {e.framework: e.sample for e in blocks[("train", "")].entries}
    assert _throughput_cells(frame) == {fw: (tables.fmt(s.point), s.n) for fw, s in block.items()}


def test_a_stale_aggregate_shows_its_repeats_figure_in_the_tables_as_in_the_answer():
    """A repeat synced after its aggregate closed: the aggregate's logged median misses it; the
    tables pool the repeats as the answer does, never the stale logged figure."""
    g = _quiet()
    g.group("torch", "train", {}, [10.0, 20.0, 30.0], "throughput_samples_per_s", {})
    g.group("jax", "train", {}, [40.0, 50.0], "throughput_samples_per_s", {})
    g.runs[-1].metrics["throughput_samples_per_s"] = 40.0  # logged before the second repeat
    g.runs[-1].metrics["repeats"] = 1.0
    frame = search_frame(g.runs)
    (block,), _ = answer.blocks(frame)
    assert {e.framework: e.sample.point for e in block.entries} == {"torch": 20.0, "jax": 45.0}
    assert _throughput_cells(frame) == {"torch": ("20.0", 3), "jax": ("45.0", 2)}


# -- one test per contradiction of issue 58, each on a small store of its own

def _converge(g, fw, times, digest="mnistdigest00001", data="mnist", target="0.8"):
    params = {"data.name": data, "scenario.target": target, "scenario.metric": "accuracy"}
    g.group(fw, "converge", params, times, "time_to_target_s", {},
            lambda: {"fxtrack.data_digest": digest})
    for run in g.runs[-(len(times) + (len(times) > 1)):]:
        run.metrics["reached_target"] = float("time_to_target_s" in run.metrics
                                              or run.tags.get("fxtrack.kind") == "aggregate")


def _quiet(seed=0):
    g = Generator(seed)
    g.rng.random = lambda: 0.99  # no contended or noisy run unless a test plants one
    return g


def test_1_a_separate_run_never_pools_with_a_later_repeat_group():
    g = _quiet()
    _converge(g, "jax", [9.0])  # an earlier separate run of the same config
    _converge(g, "jax", [1.0, 2.0, 3.0, 4.0, 5.0])
    _converge(g, "torch", [6.0, 4.0, 8.0, 2.0, 10.0])
    frame = search_frame(g.runs)
    (block,), _ = answer.blocks(frame)
    jax = next(e.sample for e in block.entries if e.framework == "jax")
    assert (jax.point, jax.n) == (3.0, 5)  # the middle three of the five, not six runs
    ((_, figures),) = converge.groups(frame)
    assert {name: f.point for name, f in figures} == {"jax": 3.0, "torch": 6.0}
    table = converge.section(None, frame).tables[0]
    assert [r[3] for r in table.rows] == ["3", "6"] and table.rows[1][5].startswith("2.00x")


def test_2_runs_on_other_data_are_another_experiment_and_the_latest_file_shows():
    g = _quiet()
    _converge(g, "jax", [1.0], "aaaa1111bbbb2222", "file")
    _converge(g, "torch", [2.0], "cccc3333dddd4444", "file")
    _converge(g, "torch", [3.0], "eeee5555ffff6666", "file")  # the latest, on a third file
    frame = search_frame(g.runs)
    blocks, _ = answer.blocks(frame)
    assert sorted((b.held["data_digest"], [e.framework for e in b.entries]) for b in blocks) == [
        ("aaaa1111bbbb2222", ["jax"]), ("cccc3333dddd4444", ["torch"]),
        ("eeee5555ffff6666", ["torch"])]
    titles = [t.title for t in converge.section(None, frame).tables]
    assert len(titles) == 3 and any("data=file (eeee5555)" in t for t in titles)
    assert all("data=file (" in b.where for b in blocks)  # each block says which file


def test_3_a_converge_run_logs_its_host_load_and_a_loaded_one_is_contended(spec_factory,
                                                                            tmp_path, monkeypatch):
    from fxtrack.measure import host_load
    from fxtrack.worker.__main__ import run
    from tests.test_converge import converge_spec, tiny_images

    result = run(converge_spec(spec_factory, tiny_images(tmp_path / "d.npz"), eval_every=2))
    assert "host_other_cpu_frac" in result.metrics and result.tags["contended"] in ("true", "false")
    assert len(result.tags["data_digest"]) == 16

    class Loaded(host_load.LoadSampler):  # another process took half the cores
        def stop(self):
            super().stop()
            self.other_cpu_frac = 0.5
            return self

    monkeypatch.setattr(host_load, "LoadSampler", Loaded)
    loaded = run(converge_spec(spec_factory, tiny_images(tmp_path / "e.npz"), eval_every=2))
    assert loaded.tags["contended"] == "true" and loaded.metrics["host_other_cpu_frac"] == 0.5


def test_4_an_objective_with_a_figure_is_never_listed_as_missing_and_commands_carry_dims():
    g = _quiet()
    for fw in ("torch", "jax"):
        g.group(fw, "train", {}, [10.0], "throughput_samples_per_s", {})
        g.group(fw, "converge", {"data.name": "mnist", "scenario.target": "0.8",
                                 "model.patch": "7", "model.image_size": "28"},
                [5.0], "time_to_target_s", {"reached_target": 1.0})
    blocks, missing = answer.blocks(search_frame(g.runs))
    have = {(b.objective.key, b.label) for b in blocks}
    assert ("train", "vit tiny") in have
    assert not [m for m in missing if (m.objective.key, m.label) in have]
    train = next(m for m in missing if m.objective.key == "train" and "patch=7" in m.label)
    assert "model.patch=7" in train.command() and "size=tiny" in train.command()


def test_5_the_compile_block_reads_the_compile_time_the_runs_line_says():
    g = _quiet()
    for fw, (compile_s, first) in {"torch": (11.3, 21.2), "jax": (4.0, 5.0)}.items():
        g.group(fw, "train", {}, [10.0], "throughput_samples_per_s",
                {"compile_time_s": compile_s, "first_step_time_s": first})
    blocks, _ = answer.blocks(search_frame(g.runs))
    block = next(b for b in blocks if b.objective.key == "compile")
    assert block.best.metric == "compile_time_s"
    assert {e.framework: e.sample.point for e in block.entries} == {"torch": 11.3, "jax": 4.0}


def test_6_serving_caveats_reach_the_page_and_report_and_the_sentence_shows_the_tables_ratio(
        tmp_path, capsys):
    from fxtrack.report import page
    from fxtrack.report.cli import main

    g = _quiet()
    for fw, rate, tags in (("torch", 1024.0, {"fxtrack.serve_rate_short": "true",
                                              "fxtrack.serve_p99_undersized": "true"}),
                           ("jax", 32.0, {})):
        g.group(fw, "serve", {"scenario.rate": "search", "scenario.batching": "static"}, [rate],
                "max_rate_under_slo_rps", {"goodput_rps": rate}, lambda t=tags: t)
    frame = search_frame(g.runs)
    (block,), _ = [b for b in answer.blocks(frame)[0] if b.objective.key == "serve"], None
    table = page.table(block)
    torch = next(r for r in table.rows if r[0] == "PyTorch")
    assert torch[-1] == "rate short, p99 from few requests"
    words = answer.sentence(block)
    assert "rate short" in words and "p99 from few requests" in words
    jax_ratio = next(r for r in table.rows if r[0] == "JAX")[4]
    assert f"JAX ({jax_ratio} the best's figure)" in words  # 0.03x in both, never 32.00x
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    log(g.runs, uri)
    assert main(["--uri", uri, "--out", str(tmp_path / "r"), "--format", "md"]) == 0
    text = (tmp_path / "r" / "report.md").read_text()
    assert "rate short, p99 from few requests" in text


def test_7_runs_to_another_target_are_another_block_never_a_lever():
    g = _quiet()
    _converge(g, "torch", [1.0], target="0.5")
    _converge(g, "jax", [9.0], target="0.8")
    blocks, _ = answer.blocks(search_frame(g.runs))
    assert sorted((b.where, [e.framework for e in b.entries]) for b in blocks) == [
        ("scenario.target=0.5", ["torch"]), ("scenario.target=0.8", ["jax"])]
    assert all("target" not in e.mode for b in blocks for e in b.entries)


def test_8_a_thinner_later_group_stands_and_the_page_says_a_fuller_one_exists():
    g = _quiet()
    g.group("torch", "train", {}, [10.0, 11.0, 12.0], "throughput_samples_per_s", {})
    g.group("torch", "train", {}, [20.0, 21.0], "throughput_samples_per_s", {})
    g.group("jax", "train", {}, [15.0, 16.0, 17.0], "throughput_samples_per_s", {})
    blocks, _ = answer.blocks(search_frame(g.runs))
    block = next(b for b in blocks if b.objective.key == "train")
    torch = next(e.sample for e in block.entries if e.framework == "torch")
    assert (torch.n, torch.earlier) == (2, 3) and torch.point == pytest.approx(20.5)
    assert "an earlier group had 3" in answer.sentence(block)


# -- every suggestion checked before it is shown

@pytest.mark.parametrize("seed", [0, 1])
def test_every_suggested_command_of_a_generated_store_passes_the_validator_or_says_why(seed):
    from fxtrack.config.suggest import refusal

    _, missing = answer.blocks(search_frame(generate(seed).runs))
    assert missing
    for m in missing:
        shown = m.checked()
        assert (refusal(m.command()) is None) == (not shown.startswith("#")), shown
    assert any(not m.checked().startswith("#") for m in missing)


def test_the_two_suggestions_that_failed_now_run_here():
    from fxtrack.config.suggest import refusal

    quality = next(o for o in answer.objectives() if o.key == "quality")
    llama = answer.Missing(quality, "llama", ("torch",)).command()
    vit = answer.Missing(quality, "vit", ("torch",)).command()
    assert "data=pycode" in llama and "model.patch=7" in vit and "data=mnist" in vit
    assert refusal(llama) is None and refusal(vit) is None
    # what the page suggested before: refused here, so never shown as if it would run
    assert "byte corpus" in refusal("python -m fxtrack framework=torch model=llama "
                                    "scenario=converge data=mnist")
    assert "divisible" in refusal("python -m fxtrack framework=torch model=vit "
                                  "scenario=converge data=mnist")


def test_a_runtime_whose_package_is_missing_is_refused_before_any_work(monkeypatch):
    from fxtrack import runtimes
    from fxtrack.config.suggest import checked, refusal
    from fxtrack.report import claim_plans

    monkeypatch.setitem(runtimes.PACKAGES, "onnxruntime", ("no_such_module_here", "onnxruntime"))
    refusal.cache_clear()
    line = ("python -m fxtrack framework=tensorflow model=resnet50 scenario=inference "
            "runtime=onnxruntime size=tiny repeats=3")
    assert "needs the 'onnxruntime' package" in refusal(line)
    assert checked(line).startswith("# fails here (")
    # the plan of a claim on that runtime: commented, not printed as if it would run
    claim = type("Claim", (), {"conditions": {"model": "resnet50", "scenario": "inference"},
                               "arm_keys": ["runtime"], "test": "anywhere", "kind": "ratio",
                               "arms": [{"runtime": "native"}, {"runtime": "onnxruntime"}]})()
    lines = claim_plans.plan(claim, "cpu")
    assert lines and all(line.startswith("#") for line in lines), lines
    refusal.cache_clear()


def test_the_page_keeps_its_tables_and_charts_inside_it_in_a_real_browser(tmp_path):
    """The page as a person reads it: laid out by Chromium in an 800-pixel window, no table,
    chart or command reaches past it (a wide table scrolls inside its own box)."""
    import shutil
    import sys
    from pathlib import Path

    if shutil.which("chromium") is None:
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs"))
    import figures_shot

    page = figures_shot.report_page(3, tmp_path)
    assert figures_shot.overflow(page, width=800) == {"past": [], "tables": 0}


@pytest.mark.parametrize("seed", [0, 5])
def test_the_reports_sections_and_report_md_carry_each_figures_caveats(seed, tmp_path):
    """report.md through the real report: each serve figure's row in the Serving section and
    each time-to-quality row say the caveats its answer block says; the page's table rows too."""
    import re

    from fxtrack.report.cli import main

    g = generate(seed)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    log(g.runs, uri)
    assert main(["--uri", uri, "--out", str(tmp_path / "r"), "--format", "md", "--no-log"]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    serving = md[md.index("\n## Serving\n"):md.index("\n## Time to quality\n")]
    for fw, want in g.expected[("serve", "")].items():
        for words in want.caveats:
            rows = [line for line in serving.splitlines() if line.startswith(f"| {fw} static")
                    or line.startswith(f"| {fw} continuous")]
            assert any(words in row for row in rows), (fw, words, rows)
    # one table puts each framework's static and continuous policies side by side
    assert serving.count("### Serving: vit tiny\n") == 1
    for fw in g.expected[("serve", "")]:
        assert f"| {fw} static" in serving and f"| {fw} continuous" in serving, fw
    quality = md[md.index("\n## Time to quality\n"):]
    for (key, where), want in g.expected.items():
        if key != "quality":
            continue
        for fw, e in want.items():
            shown = [w for w in sorted(e.caveats) if w != "earlier"]
            pattern = re.compile(rf"^\| {fw} .*\| (.*) \|$", re.MULTILINE)
            rows = pattern.findall(quality)
            assert any(all(w in row for w in shown) for row in rows), (where, fw, shown, rows)


def test_the_answer_gives_serving_capacity_in_users_beside_the_rate():
    g = _quiet()
    for fw, users, rate in (("torch", 8.0, 40.0), ("jax", 16.0, 30.0)):
        g.group(fw, "serve", {"scenario.rate": "search", "scenario.batching": "static"}, [rate],
                "max_rate_under_slo_rps", {"goodput_rps": rate})
        g.group(fw, "serve", {"scenario.concurrency": "search", "scenario.batching": "static"},
                [users], "max_concurrency_under_slo", {"goodput_rps": 1.0})
    blocks, _ = answer.blocks(search_frame(g.runs))
    users = next(b for b in blocks if b.objective.key == "users")
    assert {e.framework: e.sample.point for e in users.entries} == {"torch": 8.0, "jax": 16.0}
    assert "(serving capacity in concurrent users, batch" in answer.sentence(users)
    rate = [b for b in blocks if b.objective.key == "serve"
            and b.held.get("scenario.concurrency", "-") == "-"]
    assert {e.framework: e.sample.point for e in rate[0].entries} == {"torch": 40.0, "jax": 30.0}
