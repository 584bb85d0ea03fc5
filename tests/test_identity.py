"""One comparison identity (issue 42): the answer, every table and chart, compare and the header
read one figure per experiment from a store like a new user's (a full run, tiny runs, three
separate runs with equal params, a repeats=3 sweep, a fit and two serve loads), logged with the
real tag, param and metric keys into a temporary MLflow store (no framework runs)."""

from __future__ import annotations

import time

import pytest

mlflow = pytest.importorskip("mlflow")

from fxtrack.orchestrator import repeats  # noqa: E402
from fxtrack.report import (answer, charts, compare, identity, pareto, samples, select,  # noqa: E402
                            tables, verdicts)
from fxtrack.scenarios.serve import section as serving  # noqa: E402
from fxtrack.report.cli import main  # noqa: E402
from fxtrack.tracking import reader  # noqa: E402

T0 = int(time.time() * 1000) - 3_600_000
JAX_SEPARATE = [58.0, 93.0, 24.3]  # three separate jax runs, equal params: the last stands
TF_REPEATS = [30.0, 31.0, 29.0]  # one repeats=3 sweep: these alone pool
TORCH_TINY, TORCH_FULL = 20.0, 12.0
SERVE_FIXED, SERVE_SEARCH = 7.04, 92.15  # jax serve at rate=8, and its rate search


class Store:
    def __init__(self, uri):
        self.client = mlflow.MlflowClient(uri)
        self.exp = self.client.create_experiment("fxtrack")
        self.n = 0
        self.ids: dict[str, str] = {}

    def log(self, name, fw, metrics, scenario="train", size="tiny", batch="2", params=None, tags=None):
        self.n += 1
        base = {"fxtrack.framework": fw, "fxtrack.model": "vit", "fxtrack.scenario": scenario,
                "fxtrack.precision": "fp32", "fxtrack.devices": "1", "fxtrack.hardware": "cpu",
                "fxtrack.device": "cpu", "fxtrack.status": "ok", "fxtrack.cpu": "Test EPYC (2 cores)"}
        run = self.client.create_run(self.exp, start_time=T0 + self.n * 1000,
                                     tags={**base, **(tags or {})}, run_name=name)
        rid = run.info.run_id
        # what every run logs: its size, batch and the scenario's options (schema defaults)
        for key, value in {"size.name": size, "batch_size": batch, "framework.compile": "auto",
                           "scenario.rate": "search", "scenario.max_batch": "4",
                           **(params or {})}.items():
            self.client.log_param(rid, key, value)
        for key, value in metrics.items():
            self.client.log_metric(rid, key, value)
        self.client.set_terminated(rid, "FINISHED", end_time=T0 + self.n * 1000 + 500)
        self.ids[name] = rid
        return rid


def _train(thr):
    return {"throughput_samples_per_s": thr, "peak_rss_mib": 500.0 + thr}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"
    return uri, build(uri)


def build(uri: str) -> dict[str, str]:
    """The store of issue 42 at ``uri`` (docs/identity_shot.py photographs its page); returns
    run name -> run id."""
    s = Store(uri)
    s.log("full", "torch", _train(TORCH_FULL), size="full", batch="4")  # the README's ViT-B/16
    s.log("torch-tiny", "torch", _train(TORCH_TINY))
    for i, thr in enumerate(JAX_SEPARATE):
        s.log(f"jax-tiny-{i}", "jax", _train(thr))
    for i, thr in enumerate(TF_REPEATS):  # repeats=3: three repeats, then their aggregate
        s.log(f"tf-r{i}", "tensorflow", _train(thr), tags={"fxtrack.repeat_of": "agg-tf",
                                                           "fxtrack.repeat": str(i)})
    agg = repeats.aggregate_metrics([_train(t) for t in TF_REPEATS])
    s.log("tf-agg", "tensorflow", agg, tags={"fxtrack.kind": "aggregate", "fxtrack.repeats": "3",
                                             "fxtrack.result_id": "agg-tf"})
    fit = s.log("jax-fit", "jax", {"max_batch_size": 16.0, "memory_budget_gib": 1.0,
                                   "throughput_at_max_samples_per_s": 40.0},
                scenario="fit", tags={"fxtrack.fit_axis": "batch_size", "fxtrack.result_id": "fit-1"})
    for b in (8, 16):  # the fit's probes
        s.log(f"jax-fit-b{b}", "jax", _train(10.0 + b), scenario="fit", batch=str(b),
              tags={"fxtrack.fit_of": "fit-1", "fxtrack.fit": "fits", "mlflow.parentRunId": fit})
    serve = {"goodput_rps": 0.0, "serve_e2e_ms_p99": 0.0, "request_throughput_rps": 0.0}
    s.log("jax-rate8", "jax", {**serve, "max_rate_under_slo_rps": SERVE_FIXED,
                               "goodput_rps": SERVE_FIXED, "serve_e2e_ms_p99": 150.0,
                               "requested_rate_rps": 8.0, "request_throughput_rps": SERVE_FIXED},
          scenario="serve", params={"scenario.rate": "8"})
    search = s.log("jax-search", "jax", {**serve, "max_rate_under_slo_rps": SERVE_SEARCH,
                                         "goodput_rps": SERVE_SEARCH, "serve_e2e_ms_p99": 300.0,
                                         "request_throughput_rps": SERVE_SEARCH},
                   scenario="serve")
    for rate, passed in ((64.0, "pass"), (128.0, "fail")):  # the search's probes
        s.log(f"jax-probe-{rate:g}", "jax", {"requested_rate_rps": rate, "goodput_rps": rate * 0.9,
                                             "serve_e2e_ms_p99": 1e6 if passed == "fail" else 280.0,
                                             "request_throughput_rps": rate * 0.9},
              scenario="serve", params={"scenario.rate": str(rate)},
              tags={"fxtrack.serve_probe_of": "x", "fxtrack.serve_probe": passed,
                    "mlflow.parentRunId": search})
    s.log("torch-search", "torch", {"max_rate_under_slo_rps": 50.0, "goodput_rps": 50.0,
                                    "serve_e2e_ms_p99": 200.0, "request_throughput_rps": 50.0},
          scenario="serve")
    return s.ids


@pytest.fixture(scope="module")
def frame(store):
    return reader.load_runs(store[0], "fxtrack", None)


pytestmark = pytest.mark.usefixtures("isolated_store")


def _block(blocks, key, label):
    return next(b for b in blocks if b.objective.key == key and b.label == label)


def test_a_model_is_named_by_the_dims_that_ran():
    assert identity.size_label("vit", "full") == "ViT-B/16"
    assert identity.size_label("vit", "full", {"layers": "-"}) == "ViT-B/16"
    assert identity.size_label("vit", "tiny") == "vit tiny"
    assert identity.size_label("vit", "full", {"layers": "2", "image_size": "32"}) == (
        "vit (image_size=32, layers=2)")
    assert identity.size_label("vit", "full", {"layers": "12"}) == "ViT-B/16"  # its own dims
    assert identity.size_label("llama", "tiny", {"layers": "4"}) == "llama tiny (layers=4)"
    assert identity.size_label("vit", "-") == "vit"  # no size logged: not claimed to be ViT-B/16
    # compare's and claims' configs: "size full" of a 2-layer run would mislead
    assert identity.label_of({"model": "vit", "size": "full", "model.layers": "2"}) == "vit (layers=2)"
    assert identity.published({"model": "vit", "size": "full", "model.layers": "-"})
    assert not identity.published({"model": "vit", "size": "full", "model.layers": "2"})


def test_only_the_sweeps_repeats_pool_and_the_answer_and_tables_agree(frame, store):
    ids = store[1]
    blocks, _ = answer.blocks(frame)
    tiny = _block(blocks, "train", "vit tiny")
    by_fw = {e.framework: e for e in tiny.entries}
    # the latest of three separate runs stands alone; the repeats=3 sweep is one pooled figure
    assert by_fw["jax"].sample.point == JAX_SEPARATE[-1] and by_fw["jax"].sample.n == 1
    assert by_fw["jax"].sample.run_ids == [ids["jax-tiny-2"]]
    assert by_fw["tensorflow"].sample.n == 3 and by_fw["tensorflow"].sample.run_ids == [ids["tf-agg"]]
    assert by_fw["torch"].sample.point == TORCH_TINY
    assert tiny.best.framework == "tensorflow"

    runs = select.latest_runs(frame).runs
    (thr,) = [t for t in tables.throughput(runs) if t.title.endswith("train, fp32, x1, cpu")]
    rows = {r[0]: dict(zip(thr.header[1:], r[1:])) for r in thr.rows}
    for fw, entry in by_fw.items():  # every figure and ratio of the answer, in the table
        ratio = next(r.ratio for r in tiny.ratios if r.framework == fw)
        assert rows["vit tiny"][fw].startswith(f"{entry.sample.point:,.1f}")
        assert f"({ratio:.2f}x)" in rows["vit tiny"][fw]
    (verdict,) = [t for t in verdicts.table(runs) if t.title.endswith("train, fp32, x1, cpu")]
    row = next(r for r in verdict.rows if r[0] == "vit tiny")
    assert row[-1].startswith(f"{tiny.best.framework} fastest")


def test_the_full_run_is_shown_and_named_by_its_dims(frame):
    blocks, _ = answer.blocks(frame)
    full = _block(blocks, "train", "ViT-B/16")
    assert [e.framework for e in full.entries] == ["torch"] and full.best.sample.point == TORCH_FULL
    assert full.batch == "4"
    tiny = _block(blocks, "train", "vit tiny")
    assert "ViT-B/16" not in answer.sentence(tiny) and "vit tiny" in answer.sentence(tiny)
    assert answer.sentence(full).endswith("training throughput of ViT-B/16.")
    runs = select.latest_runs(frame).runs
    (thr,) = [t for t in tables.throughput(runs) if t.title.endswith("train, fp32, x1, cpu")]
    rows = {r[0]: r[1:] for r in thr.rows}
    assert set(rows) == {"ViT-B/16", "vit tiny"}
    assert rows["ViT-B/16"][thr.header[1:].index("torch")].startswith(f"{TORCH_FULL:,.1f}")


def test_the_charts_draw_the_figures_the_tables_show(frame, tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(charts.plt, "close", figures.append)
    runs = select.latest_runs(frame).runs
    (chart,) = [c for c in charts.throughput_charts(runs, tmp_path) if "train" in c.title]
    (fig,) = figures
    ax = fig.axes[0]
    heights = sorted(round(p.get_height(), 2) for p in ax.patches if p.get_height() > 0)
    assert heights == sorted([TORCH_FULL, TORCH_TINY, JAX_SEPARATE[-1], 30.0])
    assert sorted(t.get_text() for t in ax.get_xticklabels()) == ["ViT-B/16", "vit tiny"]
    assert "full models" not in chart.title and "model sizes as labelled" in chart.caption
    # the trade-off charts: one per model at its dims, never a full run beside tiny ones
    drawn = pareto.charts(frame, tmp_path)
    train = {d.title: d for d in drawn if d.title.endswith(", train")}
    assert set(train) == {"Trade-offs: ViT-B/16, train", "Trade-offs: vit tiny, train"}
    assert {p.y for p in train["Trade-offs: vit tiny, train"].points} == {
        TORCH_TINY, JAX_SEPARATE[-1], 30.0}


def test_serving_loads_stay_apart_in_tables_charts_and_compare(frame):
    runs = select.latest_runs(frame).runs
    served = serving.tables(runs, frame)
    rates = {t.title: t.rows for t in served if "goodput at" not in t.title}
    assert set(rates) == {"Serving: vit tiny [scenario.rate=8]", "Serving: vit tiny [scenario.rate=search]"}
    assert rates["Serving: vit tiny [scenario.rate=8]"][0][:2] == ["jax", f"{SERVE_FIXED:.2f}"]
    search = {r[0]: r[1] for r in rates["Serving: vit tiny [scenario.rate=search]"]}
    assert search == {"torch": "50.00", "jax": f"{SERVE_SEARCH:.2f}"}
    points = pareto.points(frame, "vit", pareto.AXES[1], "vit tiny")
    jax = sorted((p.x, p.y) for p in points if p.framework == "jax")
    assert jax == [(SERVE_FIXED, 150.0), (SERVE_SEARCH, 300.0)]  # never their mean
    blocks, _ = answer.blocks(frame)
    # another load is another experiment: its own block, titled by it, never a row beside it
    serve = {b.where: b for b in blocks if b.objective.key == "serve" and b.label == "vit tiny"}
    assert set(serve) == {"scenario.rate=8", "scenario.rate=search"}
    assert {e.framework: e.sample.point for e in serve["scenario.rate=search"].entries} == {
        "jax": SERVE_SEARCH, "torch": 50.0}
    assert {e.framework: e.sample.point for e in serve["scenario.rate=8"].entries} == {
        "jax": SERVE_FIXED}
    assert all("scenario.rate" not in e.mode for b in serve.values() for e in b.entries)
    assert "scenario.rate" in samples.identity_columns(frame)
    result = compare.compare(frame, frame, "max_rate_under_slo_rps", False,
                             samples.identity_columns(frame))
    assert sorted(p.base.point for p in result.pairs) == sorted([SERVE_FIXED, SERVE_SEARCH, 50.0])
    train = compare.compare(frame, frame, "throughput_samples_per_s", False,
                            samples.identity_columns(frame))
    assert sorted((p.base.point, p.base.n) for p in train.pairs) == sorted(
        [(TORCH_FULL, 1), (TORCH_TINY, 1), (JAX_SEPARATE[-1], 1), (30.0, 3)])


def test_the_header_counts_repeats_and_probes_apart(frame, store, tmp_path, capsys):
    selection = select.latest_runs(frame)
    assert selection.skipped["repeats counted in their aggregate"] == 3
    assert selection.skipped["probes counted in their search (fit, serve)"] == 4
    assert selection.skipped["superseded by a later run"] == 2  # the earlier separate jax runs
    assert main(["--uri", store[0], "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "3 repeats counted in their aggregate, 4 probes counted in their search" in out


def test_suggested_commands_use_what_ran_here_and_a_size_that_fits(frame):
    _, missing = answer.blocks(frame)
    latency = next(m for m in missing if m.model == "vit" and m.objective.key == "latency")
    # keras never ran in this store: it is not suggested (it may not be installed)
    assert "framework=torch,tensorflow,jax model=vit" in latency.command()
    assert "keras" not in latency.command()
    import pandas as pd

    # an 8B Llama's training state (~128 GB) is refused by the memory check on a CPU host:
    # the suggestion is the size that runs here
    ran = pd.DataFrame([{"model": "llama_8b", "framework": "jax", "size": "full", "hardware": "cpu"}])
    train = next(o for o in answer.objectives() if o.key == "train")
    ran["label"] = "Llama 3 8B"
    assert answer._suggested(ran, "llama_8b", train, ran).command() == (
        "python -m fxtrack framework=jax model=llama_8b scenario=train repeats=3 size=tiny")


def test_suggestions_name_only_the_frameworks_installed_here(frame, monkeypatch):
    """The store's runs may come from another machine: a suggestion names what this one has."""
    from types import SimpleNamespace

    from fxtrack.config import frameworks
    from fxtrack.report import claim_plans

    monkeypatch.setattr(frameworks, "installed", lambda: ("jax",))
    _, missing = answer.blocks(frame)
    latency = next(m for m in missing if m.model == "vit" and m.objective.key == "latency")
    assert "python -m fxtrack framework=jax model=vit" in latency.command()
    claim = SimpleNamespace(conditions={"model": "resnet50", "scenario": "train"}, test="ratio",
                            arm_keys=("framework",), kind="ratio",
                            arms=[{"framework": "torch", "value": 1.0}, {"framework": "jax", "value": 1.1}])
    (line,) = claim_plans.plan(claim, "cpu")
    assert line.startswith("# needs framework=torch (not in this install)")


def test_claims_plan_comments_out_a_precision_this_cpu_lacks(monkeypatch):
    from types import SimpleNamespace

    from fxtrack.measure import peak
    from fxtrack.report import claim_plans

    monkeypatch.setattr(peak, "native_precision", lambda precision, kind: False)
    claim = SimpleNamespace(conditions={"model": "resnet50", "scenario": "train", "precision": "fp16"},
                            test="ratio", arm_keys=("framework",), kind="ratio",
                            arms=[{"framework": "torch", "value": 1.0}, {"framework": "jax", "value": 1.1}])
    (line,) = claim_plans.plan(claim, "cpu")
    assert line.startswith("# needs hardware with precision=fp16") and "hardware=cpu" in line
    claim.conditions["precision"] = "fp32"
    (line,) = claim_plans.plan(claim, "cpu")
    assert line.startswith("python -m fxtrack -m framework=torch,jax model=resnet50")


def test_the_first_hour_readme_gitignore_and_no_font_noise(tmp_path):
    """The README names every sub-command; what its commands write stays out of git status;
    matplotlib's font-cache line never reaches a run's log."""
    import logging
    import subprocess
    import sys
    from pathlib import Path

    from fxtrack.cli import SUBCOMMANDS

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    assert all(f"fxtrack {name}" in readme for name in SUBCOMMANDS)
    ignored = (root / ".gitignore").read_text().split()
    assert {"mlflow.db", "mlflow.db.lock", "fxtrack-report/"} <= set(ignored)
    # a fresh font cache (MPLCONFIGDIR empty), INFO logging on as Hydra's job logging has it
    code = ("import logging; logging.basicConfig(level=logging.INFO, format='[HYDRA] %(message)s');"
            "import fxtrack.report.charts")
    env = {"MPLCONFIGDIR": str(tmp_path / "mpl"), "PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    err = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120).stderr
    assert "fontManager" not in err and "[HYDRA]" not in err, err
    assert logging.getLogger("matplotlib").level == logging.WARNING


def test_a_runs_last_lines_name_the_store_and_what_to_open_next(monkeypatch):
    from fxtrack.tracking import runs, ui

    local = ui.next_steps("sqlite:////tmp/x/mlflow.db", "abc123")
    assert local.splitlines()[0] == "[fxtrack] results in sqlite:////tmp/x/mlflow.db"
    assert "fxtrack report" in local and "fxtrack ui" in local and "abc123" in local
    monkeypatch.setitem(runs._EXPERIMENTS, ("http://mlflow:5000", "fxtrack"), "7")
    served = ui.next_steps("http://mlflow:5000", "abc123", "the sweep's parent run")
    assert served.splitlines()[-1].endswith(
        "the sweep's parent run in the MLflow UI: "
        "http://mlflow:5000/#/experiments/7/runs/abc123?workflowType=machine_learning")


def test_terminal_tables_fit_100_columns_and_the_closing_table_names_serve_figures(tmp_path, capsys):
    from fxtrack.orchestrator.sweep import closing_table
    from fxtrack.report import claims

    note = ("NotSupported: tensorflow has no path for runtime=onnxruntime quantize=dynamic_int8 "
            "(tf2onnx leaves the quantized ops to the exporter)")
    jobs = [{"name": "jax-vit-serve-fp32-x1-tiny", "status": "FINISHED", "guard": "ok", "error": None,
             "metrics": {"max_rate_under_slo_rps": 92.15}, "tags": {}},
            {"name": "tensorflow-vit-inference-fp32-x1-onnxruntime-dynamic_int8", "status": "FAILED",
             "guard": "ok", "error": note, "metrics": {}, "tags": {}},
            {"name": "torch-vit-converge-fp32-x1-tiny", "status": "FINISHED", "guard": "ok",
             "error": None, "tags": {}, "metrics": {"compile_time_s": 0.0, "time_to_target_s": 2.61,
                                                    "steps_to_target": 220}}]
    table = closing_table(jobs)
    assert max(map(len, table.splitlines())) <= 100
    assert "to target 2.6 s" in table and "compile 0.0 s" not in table  # converge's headline
    assert "92.15 req/s" in table and "max rate" in table  # the serve job's figure, not "-"
    assert "exporter)" in table and "(to" not in table.replace("(tf2onnx", "")  # wrapped, not cut
    assert claims.main(["--uri", f"sqlite:///{tmp_path / 'none.db'}"]) == 0
    out = capsys.readouterr().out.split("\nto measure")[0]  # commands stay whole to paste
    table = out.split("\n", 2)[2]  # below the line naming the store
    assert len(table.splitlines()) > 10 and max(map(len, table.splitlines())) <= 100, table


def test_doctor_says_which_module_a_framework_lacks():
    from fxtrack.orchestrator.doctor import install_line

    assert install_line("jax", "jax") == "not installed (jax missing): pip install 'fxtrack[jax]'"
    line = install_line("tensorflow", "keras")
    assert "not installed (keras missing)" not in line and "needs keras" in line


def test_a_suggested_command_is_never_wrapped():
    from fxtrack.report import render
    from fxtrack.report.tables import Table

    command = "python -m fxtrack framework=jax model=vit scenario=inference batch_size=1 repeats=3 size=tiny"
    text = render.text_table(Table("gaps", ["model", "objective", "command"],
                                   [["vit", "Inference latency at batch 1", command]]))
    assert command in text  # whole, to paste, though the table runs past 100 columns


def test_a_wrapped_table_keeps_figures_with_thousands_separators():
    """A table too wide for 100 columns wraps its cells; a figure such as '1,385.0' in it is
    text, not a number to parse (tabulate's own wrapping raised ValueError on it)."""
    from fxtrack.report import render
    from fxtrack.report.tables import Table

    header = ["run", *(f"figure number {k} in ms" for k in range(6))]
    row = ["torch-llama-serve-fp32-x1-tiny-continuous", *["1,385.0"] * 6]
    text = render.text_table(Table("wide", header, [row]))
    assert max(map(len, text.splitlines())) <= render.WIDTH, text
    assert text.count("1,385.0") == 6  # each figure whole on its line


def test_another_frameworks_probe_raises_the_yardstick_only_upward_and_names_it(tmp_path,
                                                                                monkeypatch):
    """Issue 61: a CPU run's MFU is against the machine's yardstick, the fastest matmul rate any
    framework's quiet probe measured here (against its own framework's, JAX's slower bf16 ViT
    read a higher MFU than torch's). Another framework's probe raises it, never lowers it, and
    names its source; the run's own rate stays beside it (own_matmul_share: issue 42's figure,
    which no other installation moves)."""
    from fxtrack.worker.protocol import Result
    from fxtrack.orchestrator import calibration
    from fxtrack.tracking.records import summary_line

    def _trials(monkeypatch, rates, frac):  # stand-in probes: rates[fw] TFLOP/s, else not installed
        monkeypatch.setattr(calibration, "_UNCACHED", {})
        monkeypatch.setattr(calibration, "_trial", lambda fw, *a: (
            {"installed": True, "tflops": rates[fw]} if fw in rates else {"installed": False}, frac))

    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    monkeypatch.setattr(calibration, "frameworks", lambda: ["jax", "torch", "tensorflow"])
    _trials(monkeypatch, {"jax": 0.332}, frac=0.0)  # only JAX installed
    alone, tags = calibration.mfu_metrics("jax", "cpu", "fp32", "cpu", 1, 0.028, {})
    assert tags["peak_tflops_source"] == "machine-best:jax"
    assert alone["mfu"] == alone["own_matmul_share"] == pytest.approx(0.028 / 0.332)
    _trials(monkeypatch, {"jax": 0.332, "torch": 0.412}, frac=0.0)  # torch installed since
    calibration.calibrate("cpu", "fp32", "cpu", {}, refresh=True)  # e.g. fxtrack doctor
    after, tags = calibration.mfu_metrics("jax", "cpu", "fp32", "cpu", 1, 0.028, {})
    assert after["peak_tflops"] == 0.412 and tags["peak_tflops_source"] == "machine-best:torch"
    assert after["mfu"] == pytest.approx(0.028 / 0.412) and after["mfu"] < alone["mfu"]
    assert after["own_matmul_share"] == alone["own_matmul_share"]  # its own rate: unmoved
    assert after["framework_matmul_tflops"] == 0.332
    assert tags["peak_calibrated"].endswith("Z")  # the yardstick's date
    line = summary_line("jax-vit", Result("r", status="FINISHED", metrics=after, tags=tags))
    assert "MFU 6.8% (of this machine's best matmul rate, torch's)" in line
    # a slower framework's probe, or a contended faster one, never moves it
    _trials(monkeypatch, {"jax": 0.332, "torch": 0.412, "tensorflow": 0.2}, frac=0.0)
    calibration.calibrate("cpu", "fp32", "cpu", {}, only=["tensorflow"])
    _trials(monkeypatch, {"jax": 0.9}, frac=0.6)
    calibration.calibrate("cpu", "fp32", "cpu", {}, refresh=True, only=["jax"])
    later, tags = calibration.mfu_metrics("jax", "cpu", "fp32", "cpu", 1, 0.028, {})
    assert later["peak_tflops"] == 0.412 and tags["peak_tflops_source"] == "machine-best:torch"


def test_a_run_that_outruns_its_peak_recalibrates_its_own_framework_only(tmp_path, monkeypatch):
    """A run faster than its framework's cached peak measures that peak again; the other
    frameworks' cached peaks stay. Replacing the whole cache entry dropped them, so in one MFU
    table torch's first cell was read against a peak that its later cells no longer used."""
    from fxtrack.measure import peak
    from fxtrack.orchestrator import calibration

    rates = {"jax": 0.30, "torch": 0.40}
    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    monkeypatch.setattr(calibration, "frameworks", lambda: ["jax", "torch"])
    monkeypatch.setattr(calibration, "_UNCACHED", {})
    monkeypatch.setattr(calibration, "_trial", lambda fw, *a: (
        {"installed": True, "tflops": rates[fw]}, 0.0))
    calibration.calibrate("cpu", "fp32", "cpu", {})  # both cached
    rates["jax"] = 0.50  # the machine is faster now: a JAX run outruns its 0.30
    metrics, _ = calibration.mfu_metrics("jax", "cpu", "fp32", "cpu", 1, 0.45, {})
    assert metrics["peak_tflops"] == 0.50
    [entries] = peak.cached().values()
    assert entries["jax"]["tflops"] == 0.50 and entries["torch"]["tflops"] == 0.40


def test_a_profiled_run_is_the_same_experiment_and_another_option_is_not():
    """train's profile_steps is declared apart from the identity (its steps run after the timed
    window); every other scenario option, e.g. a serve rate, still sets runs apart."""
    import pandas as pd

    from fxtrack.report import identity

    base = {"tags.fxtrack.framework": "torch", "tags.fxtrack.model": "vit",
            "tags.fxtrack.scenario": "train", "params.size.name": "tiny"}
    frame = pd.DataFrame([{**base}, {**base, "params.scenario.profile_steps": "2"},
                          {**base, "params.scenario.rate": "8"}])
    ident = identity.read(frame)
    assert "scenario.profile_steps" not in identity.columns(frame)
    assert ident.iloc[0].equals(ident.iloc[1])
    assert not ident.iloc[0].equals(ident.iloc[2])
