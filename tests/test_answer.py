"""The answer page: blocks, verdicts, sentences and the Pareto frontier, from synthetic runs
logged into a temporary MLflow store with the real tag and metric keys (no framework runs)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")

from fxtrack import stats  # noqa: E402
from fxtrack.report import answer, page, pareto  # noqa: E402
from fxtrack.report.cli import main  # noqa: E402
from fxtrack.tracking import reader  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated_store")

T0 = int(time.time() * 1000) - 3_600_000
# framework -> the throughput of each repeat (samples/s) of vit training at batch 8
VIT = {"jax": [120.0, 121.0, 119.0],        # best
       "torch": [100.0, 101.0, 99.0],       # clearly slower
       "tensorflow": [118.0, 125.0, 112.0]}  # overlaps jax: no clear difference
RSS = {"jax": 800.0, "torch": 600.0, "tensorflow": 900.0}  # memory: torch lowest
BERT = {"jax": [50.0], "torch": [40.0]}  # single runs
# scenario=serve of bert (the metric names scenario=serve logs): rate under the SLOs, p99 latency
SERVE = {"torch": ([30.0, 31.0, 29.0], 80.0), "jax": ([20.0, 20.5, 19.5], 60.0)}


def _log(client, exp, n, fw, model, thr, rss, batch="8", scenario="train", metrics=None,
         extra_tags=None):
    tags = {**(extra_tags or {}),"fxtrack.framework": fw, "fxtrack.model": model, "fxtrack.scenario": scenario,
            "fxtrack.precision": "fp32", "fxtrack.devices": "1", "fxtrack.hardware": "cpu",
            "fxtrack.device": "cpu", "fxtrack.status": "ok", "fxtrack.cpu": "Test EPYC (2 cores)"}
    run = client.create_run(exp, start_time=T0 + n * 1000, tags=tags, run_name=f"{fw}-{model}-{n}")
    client.log_param(run.info.run_id, "batch_size", batch)
    client.log_param(run.info.run_id, "framework.compile", "auto")
    client.log_param(run.info.run_id, "size.name", "full")  # the published dims: ViT-B/16
    for key, value in (metrics or {"throughput_samples_per_s": thr, "peak_rss_mib": rss}).items():
        client.log_metric(run.info.run_id, key, value)
    client.set_terminated(run.info.run_id, "FINISHED", end_time=T0 + n * 1000 + 500)
    return run.info.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("fxtrack")
    n = 0
    # each list is one repeats=3 run: an aggregate (its median) and its repeats, which alone
    # pool (report/identity.py)
    for fw, values in VIT.items():
        of = f"agg-vit-{fw}"
        for i, v in enumerate(values):
            n += 1
            _log(client, exp, n, fw, "vit", v, RSS[fw] + i, extra_tags={"fxtrack.repeat_of": of})
        n += 1
        _log(client, exp, n, fw, "vit", stats.median(values), RSS[fw] + 1,
             extra_tags=_aggregate(of, len(values)))
    for fw, values in BERT.items():
        n += 1
        _log(client, exp, n, fw, "bert", values[0], 500.0)
    for fw, (rates, p99) in SERVE.items():
        of = f"agg-serve-{fw}"
        for rate in rates:
            n += 1
            _log(client, exp, n, fw, "bert", None, None, scenario="serve",
                 metrics={"max_rate_under_slo_rps": rate, "goodput_rps": rate * 0.9, "serve_e2e_ms_p99": p99},
                 extra_tags={"fxtrack.repeat_of": of, "fxtrack.serve_batching": "static"})
        n += 1
        rate = stats.median(rates)
        _log(client, exp, n, fw, "bert", None, None, scenario="serve",
             metrics={"max_rate_under_slo_rps": rate, "goodput_rps": rate * 0.9, "serve_e2e_ms_p99": p99},
             extra_tags=_aggregate(of, len(rates)))
    return uri


def _aggregate(result_id, n):
    return {"fxtrack.kind": "aggregate", "fxtrack.result_id": result_id, "fxtrack.repeats": str(n)}


@pytest.fixture(scope="module")
def frame(store):
    return reader.load_runs(store, "fxtrack", None)


def _block(blocks, key, model):
    return next(b for b in blocks if b.objective.key == key and b.model == model)


def test_blocks_name_the_winner_with_the_runs_own_intervals(frame):
    blocks, _ = answer.blocks(frame)
    train = _block(blocks, "train", "vit")
    assert [e.framework for e in train.entries] == ["jax", "tensorflow", "torch"]
    assert train.best.sample.point == stats.median(VIT["jax"])
    torch = train.ratios[2]
    expected = stats.ratio_interval(stats.log_summary(VIT["torch"]), stats.log_summary(VIT["jax"]))
    assert torch.ratio == pytest.approx(100.0 / 120.0)
    assert torch.interval == pytest.approx(expected)
    assert train.verdict(torch) == "clear" and torch.interval[1] < 1
    # overlapping repeats: the interval holds 1
    assert train.verdict(train.ratios[1]) == answer.NO_CLEAR
    assert train.ratios[1].interval[0] < 1 < train.ratios[1].interval[1]
    # memory: lower is better, torch wins
    memory = _block(blocks, "memory", "vit")
    assert memory.best.framework == "torch" and memory.best.metric == "peak_rss_mib"


def test_single_runs_give_no_verdict_and_missing_objectives_their_command(frame):
    blocks, missing = answer.blocks(frame)
    bert = _block(blocks, "train", "bert")
    assert bert.best.framework == "jax" and bert.summary() == answer.SINGLE
    assert "single runs, no verdict" in answer.sentence(bert)
    commands = {(m.model, m.objective.key): m.command() for m in missing}
    assert "scenario=fit" in commands[("vit", "fit")] and "model=vit" in commands[("vit", "fit")]
    assert "scenario=serve" in commands[("vit", "serve")]
    assert "batch_size=1" in commands[("vit", "latency")]
    assert ("vit", "ttft") not in commands  # generation is asked of LMs only


def test_sentence_says_the_ratio_of_the_figures(frame):
    blocks, _ = answer.blocks(frame)
    words = answer.sentence(_block(blocks, "train", "vit"))
    low, high = sorted(1 / x for x in stats.ratio_interval(stats.log_summary(VIT["torch"]),
                                                           stats.log_summary(VIT["jax"])))
    assert words.startswith("On this Test EPYC (2 cores, cpu), JAX (compile=auto) trains ViT-B/16 "
                            f"{120 / 100:.2f}x [{low:.2f}, {high:.2f}] as fast as PyTorch at fp32")
    assert "TensorFlow shows no clear difference from JAX" in words


@pytest.mark.parametrize("points, x_lower, y_lower, expected", [
    ([(1, 10), (2, 20), (3, 15), (2, 5)], True, False, [True, True, False, False]),
    ([(1, 1), (1, 1)], True, True, [True, True]),  # equal points do not dominate each other
    ([(5, 1), (4, 2), (3, 0.5), (2, 3)], False, True, [True, False, True, False]),
    ([], True, True, []),
])
def test_frontier_on_fixed_points(points, x_lower, y_lower, expected):
    assert pareto.frontier(points, x_lower, y_lower) == expected


def test_pareto_chart_names_the_framework_never_on_the_frontier(frame, tmp_path):
    drawn = pareto.charts(frame, tmp_path)
    vit = next(d for d in drawn if d.title.endswith("ViT-B/16, train"))
    # tensorflow: more memory per sample than jax and a lower median throughput
    assert vit.never == ["tensorflow"] and "never on the frontier: TensorFlow" in vit.caption
    assert vit.path.is_file()


def test_links_open_the_runs_table_layout():
    assert page.ui_base("sqlite:///x.db") == page.DEFAULT_UI
    assert page.ui_base("http://mlflow:5000/") == "http://mlflow:5000"
    assert page.ui_base("http://mlflow:5000", "https://ui.example") == "https://ui.example"
    assert page.run_link("http://h", "3", "abc").endswith("#/experiments/3/runs/abc?workflowType=machine_learning")


def test_report_writes_the_page_answer_first(store, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["--uri", store, "--out", str(out), "--ui-url", "http://ui.test"]) == 0
    text = capsys.readouterr().out
    assert text.index("Training throughput: ViT-B/16") < text.index("Throughput (samples/s)")
    md = (out / "report.md").read_text()
    assert md.index("## The answer") < md.index("![Trade-offs: ViT-B/16, train](pareto-train-vit.png)") < md.index("## Charts")
    assert "Code size: source lines" in md and "The answer in words:" in text
    html = (out / "index.html").read_text()
    assert html.index('id="answer"') < html.index("<h2>Charts</h2>")
    assert "http://ui.test/#/experiments/" in html and "workflowType=machine_learning" in html
    assert "data:image/png;base64," in html and "src=\"http" not in html
    assert 'url=index.html' in (out / "report.html").read_text()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium on PATH (.ci/chromium.sh)")
def test_chromium_opens_the_page_offline(store, tmp_path, capsys):
    """The page offline in a fresh profile: the blocks, the charts drawn, the run links there;
    the screenshot is kept beside the page."""
    out = tmp_path / "r"
    assert main(["--uri", store, "--out", str(out)]) == 0
    page_url = (out / "index.html").as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--window-size=1400,1800",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(["chromium", *flags, "--dump-dom", page_url], capture_output=True,
                         text=True, timeout=120).stdout
    assert dom.count('class="answer-block"') >= 3
    assert dom.count("data:image/png;base64,") >= 2
    runs = mlflow.MlflowClient(store).search_runs(
        [mlflow.MlflowClient(store).get_experiment_by_name("fxtrack").experiment_id])
    ids = {r.info.run_id for r in runs}
    linked = {part.split("?")[0] for part in dom.split("/runs/")[1:]}
    assert linked and linked <= ids
    shot = out / "index.png"
    subprocess.run(["chromium", *flags, f"--screenshot={shot}", page_url], capture_output=True,
                   timeout=120)
    assert shot.is_file() and shot.stat().st_size > 10_000


def test_claims_table_says_each_claim_and_its_published_figures():
    from fxtrack.report import claims

    seed = next(c for c in claims.load() if c.id == "seed-resnet50-train-a100")
    (row,) = claims.table([claims.Verdict(seed, claims.UNMEASURED, "no runs", [], [])]).rows
    assert row[2] == seed.claim  # the one-line sentence, as published
    assert row[3] == "torch 312, tensorflow 287, jax 345 (throughput_samples_per_s)"


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium on PATH (.ci/chromium.sh)")
def test_fxtrack_ui_link_opens_the_runs_table(store, tmp_path):
    """`fxtrack ui` on the store; a fresh Chromium profile opens the printed link and finds the
    Runs table with the runs in it (not the GenAI layout)."""
    import os
    import signal
    import socket
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from conftest import fxtrack_env

    env = fxtrack_env(tmp_path, {"PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    ui = subprocess.Popen([sys.executable, "-m", "fxtrack", "ui", "--uri", store, "--port", str(port)],
                          stdout=subprocess.PIPE, stderr=open(tmp_path / "ui.err", "w"), text=True, env=env,
                          start_new_session=True, cwd=tmp_path)
    try:
        link = ui.stdout.readline().strip()
        assert link.startswith(f"http://127.0.0.1:{port}/#/experiments/"), (tmp_path / "ui.err").read_text()[-2000:]
        assert link.endswith("?workflowType=machine_learning")
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--window-size=1600,1000",
                 "--virtual-time-budget=20000", f"--user-data-dir={tmp_path / 'profile'}"]
        dom = ""
        for _ in range(3):  # a loaded machine: the UI's requests may outlast the virtual time
            dom = subprocess.run(["chromium", *flags, "--dump-dom", link], capture_output=True,
                                 text=True, timeout=180).stdout
            if "jax-vit-1" in dom:
                break
        assert "jax-vit-1" in dom  # a run name: the runs table rendered
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=30)


def test_serve_blocks_and_their_trade_off_read_the_serve_metrics(frame, tmp_path):
    blocks, missing = answer.blocks(frame)
    serve = _block(blocks, "serve", "bert")
    assert serve.best.framework == "torch" and serve.best.metric == "max_rate_under_slo_rps"
    assert serve.best.mode.endswith("static batching")  # the policy is part of the answer
    assert serve.verdict(serve.ratios[1]) == "clear"
    assert ("bert", "serve") not in {(m.model, m.objective.key) for m in missing}
    chart = next(d for d in pareto.charts(frame, tmp_path) if d.title.endswith("BERT-base, serve"))
    # torch: more requests/s but a higher p99; jax: the lower p99: both on the frontier
    assert chart.on_frontier == [True, True] and chart.never == []


def test_the_end_of_run_line_links_the_run_page_on_a_server():
    from fxtrack.tracking import runs, writer

    runs._EXPERIMENTS[("http://mlflow.test:5000", "fxtrack")] = "7"
    line = writer._ui_link("http://mlflow.test:5000", {"experiment": "fxtrack"}, "abc")
    assert line == " at http://mlflow.test:5000/#/experiments/7/runs/abc?workflowType=machine_learning"
    assert writer._ui_link("sqlite:///x.db", {"experiment": "fxtrack"}, "abc") == ""


def test_a_lower_is_better_amount_reads_as_a_fraction_of_the_other(frame):
    blocks, _ = answer.blocks(frame)
    words = answer.sentence(_block(blocks, "memory", "vit"))
    # torch holds 600 MiB, jax 800, tensorflow 900: "in 0.75x the peak memory of JAX"
    assert f"trains ViT-B/16 in {600 / 800:.2f}x [" in words and "the peak memory of JAX" in words
    assert f"in {600 / 900:.2f}x [" in words and "the peak memory of TensorFlow" in words
