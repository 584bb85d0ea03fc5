"""``fxtrack report`` against runs written straight into a temporary MLflow store with the real
tag and metric keys: what is kept, the ratios, the files, and the one-line failures."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pandas as pd
import pytest

mlflow = pytest.importorskip("mlflow")

from fxtrack.measure.complexity import code_metrics  # noqa: E402
from fxtrack.report.cli import main  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated_store")  # the report run's spool entry

T0 = int(time.time() * 1000) - 3_600_000  # an hour ago; runs are spaced a second apart after it
HOST = {"fxtrack.cpu": "Test CPU 9000", "fxtrack.host": "bench-1", "fxtrack.python": "3.11.9",
        "fxtrack.version": "0.1.0"}
VERSIONS = {"torch": "2.5.1", "jax": "0.4.35"}


def _run(client, exp_id, n, framework, model, metrics, status="FINISHED", check="ok",
         scenario="train", devices=1, guard=None):
    tags = dict(HOST, **{
        "fxtrack.framework": framework, "fxtrack.model": model, "fxtrack.scenario": scenario,
        "fxtrack.precision": "fp32", "fxtrack.devices": str(devices), "fxtrack.hardware": "cpu",
        "fxtrack.device": "cpu", "fxtrack.framework_version": VERSIONS[framework],
        "fxtrack.status": check})
    if guard:
        tags["fxtrack.guard"] = guard
    run = client.create_run(exp_id, start_time=T0 + n * 1000, tags=tags,
                            run_name=f"{framework}-{model}-{scenario}-fp32-x{devices}")
    for key, value in metrics.items():
        client.log_metric(run.info.run_id, key, value)
    client.set_terminated(run.info.run_id, status, end_time=T0 + n * 1000 + 500)
    return run.info.run_id


def _perf(throughput, rss=900.0, **extra):
    return dict(throughput_samples_per_s=throughput, step_time_ms_p50=1000 / throughput,
                step_time_ms_p90=1100 / throughput, peak_rss_mib=rss, **extra)


# Old runs carried code size; the report now counts it in the source (these must not show).
SLOC = {"torch": dict(code_sloc=300, code_sloc_model=120, code_sloc_train=80),
        "jax": dict(code_sloc=260, code_sloc_model=110, code_sloc_train=60)}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two frameworks x two models, plus a superseded duplicate, a failed run, a sweep parent
    and a scaling run; returns the tracking URI."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("fxtrack")
    parent = client.create_run(exp, start_time=T0, tags=dict(HOST, **{"fxtrack.sweep": "-m"}),
                               run_name="sweep-20250101-000000")
    client.set_terminated(parent.info.run_id, "FINISHED")
    _run(client, exp, 1, "torch", "resnet50", _perf(999.9, **SLOC["torch"]))  # superseded below
    _run(client, exp, 2, "torch", "resnet50", _perf(123.4, **SLOC["torch"]))
    _run(client, exp, 3, "jax", "resnet50", _perf(150.0, peak_mem_device_mib=2048, mfu=0.41,
                                                  **SLOC["jax"]))
    _run(client, exp, 4, "torch", "vit", _perf(45.67))
    _run(client, exp, 5, "jax", "vit", _perf(51.3), check="guard_failed", guard="loss did not fall")
    _run(client, exp, 6, "jax", "vit", {"throughput_samples_per_s": 777.7}, status="FAILED",
         check="failed")  # newest, but failed: must not replace the guard_failed run
    _run(client, exp, 7, "torch", "resnet50", _perf(400.0, scaling_efficiency_x2=0.95,
                                                    scaling_efficiency_x4=0.9),
         scenario="scaling", devices=4)
    return uri


def report(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_report_keeps_the_latest_finished_runs_and_writes_every_file(store, tmp_path, capsys):
    out_dir = tmp_path / "report"
    code, out, err = report(capsys, "--uri", store, "--out", str(out_dir))
    assert code == 0, err
    # Terminal: both frameworks' figures as logged, with ratios to the best of each model's row.
    assert "Throughput (samples/s): train, fp32, x1, cpu" in out
    assert "123.4 (0.82x)" in out and "150.0 (1.00x)" in out  # resnet50: jax is best
    assert "45.7 (1.00x)" in out  # vit: the only run that passed the guard sets the bar ...
    assert "51.3 (1.12x) !" in out and "loss did not fall" in out  # ... the flagged one does not
    assert "400.0 (1.00x)" in out  # the scaling run is its own group
    assert "999.9" not in out and "777.7" not in out  # superseded and failed runs are gone
    assert "1 superseded by a later run, 1 failed" in out

    files = {p.name for p in out_dir.iterdir()}
    assert {"report.md", "index.html", "report.html", "report.csv", "throughput-train-fp32.png",
            "scaling.png"} <= files
    csv = pd.read_csv(out_dir / "report.csv")
    assert len(csv) == 5
    by = csv.set_index(["framework", "model", "scenario"])
    assert by.loc[("torch", "resnet50", "train"), "throughput_samples_per_s"] == 123.4
    assert by.loc[("jax", "vit", "train"), "status"] == "guard_failed"
    assert 777.7 not in csv["throughput_samples_per_s"].tolist()

    md = re.sub(r" +", " ", (out_dir / "report.md").read_text())  # cells padded to their column
    assert "| resnet50 | 123.4 (0.82x) | 150.0 (1.00x) |" in md
    assert "900 RSS" in md and "2,048 device" in md  # which memory figure each cell is
    assert "41.0%" in md and "90.0%" in md  # MFU, scaling efficiency at x4
    sloc = {fw: code_metrics(fw) for fw in ("torch", "jax")}  # counted in this source tree
    assert (f"| model | {sloc['torch']['code_sloc_model']:,.0f} | "
            f"{sloc['jax']['code_sloc_model']:,.0f} |") in md  # SLOC per dimension
    assert f"| total | {sloc['torch']['code_sloc']:,.0f} | {sloc['jax']['code_sloc']:,.0f} |" in md
    assert "2.5.1" in md and "0.4.35" in md and "Test CPU 9000" in md and "bench-1" in md
    assert "![Throughput: train, fp32, x1, cpu](throughput-train-fp32.png)" in md
    page = (out_dir / "index.html").read_text()
    assert page.split('<h2>Charts</h2>')[1].count('src="data:image/png;base64,') == 3 and "<table>" in page


def test_report_run_is_logged_apart_only_when_asked(store, tmp_path, capsys):
    client = mlflow.MlflowClient(store)
    exp = client.get_experiment_by_name("fxtrack")
    before = len(client.search_runs([exp.experiment_id], max_results=100))
    code, first, err = report(capsys, "--uri", store, "--out", str(tmp_path / "0"))
    assert code == 0 and "MLflow run" not in err  # by default nothing is logged anywhere
    code, first, err = report(capsys, "--uri", store, "--out", str(tmp_path / "a"), "--log")
    assert code == 0 and "in experiment 'fxtrack-reports'" in err, err
    # the benchmark experiment gains no run: the report run has an experiment of its own
    assert len(client.search_runs([exp.experiment_id], max_results=100)) == before
    reports = client.get_experiment_by_name("fxtrack-reports")
    assert reports.tags["mlflow.experimentKind"] == "custom_model_development"
    (logged,) = client.search_runs([reports.experiment_id], "attributes.run_name = 'report'",
                                   order_by=["attributes.start_time DESC"], max_results=1)
    assert logged.data.params["experiment"] == "fxtrack"
    assert logged.data.tags["fxtrack.kind"] == "report"
    assert "fxtrack.framework" not in logged.data.tags
    artifacts = {a.path for a in client.list_artifacts(logged.info.run_id)}
    assert {"report.md", "report.html", "report.csv", "scaling.png"} <= artifacts

    code, second, err = report(capsys, "--uri", store, "--out", str(tmp_path / "b"), "--no-log")
    assert code == 0 and "MLflow run" not in err
    table = lambda text: text.split("\n\n", 1)[1]  # noqa: E731 - past the runs-read summary
    assert table(second) == table(first)  # the report runs changed nothing


def test_format_selects_the_files(store, tmp_path, capsys):
    code, _, _ = report(capsys, "--uri", store, "--out", str(tmp_path), "--format", "csv",
                        "--no-log")
    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "home") == ["report.csv"]
    with pytest.raises(SystemExit):
        main(["--uri", store, "--format", "pdf"])


@pytest.mark.parametrize("args, message", [
    (["--filter", "tags.`fxtrack.model` = 'bert'"],
     "no runs of experiment 'fxtrack' match the filter"),
    (["--experiment", "nope"], "experiment 'nope' does not exist"),
    (["--filter", "tags.oops ==="], "invalid filter"),
])
def test_nothing_to_report_is_one_line_and_exit_1(store, tmp_path, capsys, args, message):
    code, out, err = report(capsys, "--uri", store, "--out", str(tmp_path / "r"), "--no-log", *args)
    assert code == 1
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_missing_experiment_names_those_the_store_holds(store, tmp_path, capsys):
    mlflow.MlflowClient(store).create_experiment("fxtrack-gpu-nightly")
    code, _, err = report(capsys, "--uri", store, "--experiment", "fxtrak", "--no-log")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "experiment 'fxtrak' does not exist" in err
    held = err.split("the store holds ", 1)[1]
    assert "'fxtrack'" in held and "'fxtrack-gpu-nightly'" in held and "--experiment" in held


def test_empty_experiment_and_missing_store(tmp_path, capsys, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'empty.db'}"
    mlflow.MlflowClient(uri).create_experiment("fxtrack")
    code, _, err = report(capsys, "--uri", uri, "--no-log")
    assert code == 1 and "experiment 'fxtrack'" in err and "has no runs" in err
    client = mlflow.MlflowClient(uri)
    parent = client.create_run(client.get_experiment_by_name("fxtrack").experiment_id)
    client.set_terminated(parent.info.run_id)  # a sweep parent alone is nothing to report
    code, _, err = report(capsys, "--uri", uri, "--no-log")
    assert code == 1 and "no finished benchmark runs in experiment 'fxtrack'" in err

    monkeypatch.chdir(tmp_path)  # the default URI: ./mlflow.db, which does not exist here
    code, _, err = report(capsys, "--no-log")
    assert code == 1 and f"no MLflow database at {tmp_path / 'mlflow.db'}" in err
    assert not (tmp_path / "mlflow.db").exists()  # reading never creates a store


def test_scenario_tables_and_derived_scaling_without_mlflow(tmp_path):
    """Pipeline, checkpoint and derived scaling tables from a hand-made ``search_runs`` frame."""
    from fxtrack.report import charts, select, tables

    def row(n, devices, scenario, **metrics):
        return {"run_id": f"r{n}", "status": "FINISHED",
                "start_time": pd.Timestamp(T0 + n, unit="ms", tz="UTC"),
                "end_time": pd.Timestamp(T0 + n + 1, unit="ms", tz="UTC"),
                "tags.fxtrack.framework": "jax", "tags.fxtrack.model": "bert",
                "tags.fxtrack.scenario": scenario, "tags.fxtrack.precision": "bf16",
                "tags.fxtrack.devices": str(devices), "tags.fxtrack.hardware": "gpu",
                "tags.fxtrack.status": "ok", "tags.fxtrack.host": "h",
                **{f"metrics.{k}": v for k, v in metrics.items()}}

    frame = pd.DataFrame([
        row(1, 1, "train", throughput_samples_per_s=100.0),
        row(2, 2, "train", throughput_samples_per_s=180.0),
        row(3, 1, "pipeline", throughput_samples_per_s=90.0, pipeline_samples_per_s=95.0,
            input_bound_fraction=0.25),
        row(4, 1, "checkpoint", checkpoint_save_s=0.123, checkpoint_mib=420.0),
    ])
    runs = select.latest_runs(frame).runs
    assert tables.pipeline(runs)[0].rows == [["bert", "jax", "bf16", "x1", "gpu", "90.0", "95.0",
                                              "25.0%"]]
    (ckpt,) = tables.checkpoint(runs)
    assert ckpt.header[-2:] == ["save s", "checkpoint MiB"]
    assert ckpt.rows[0][-2:] == ["0.12", "420.0"]
    (scaling,) = tables.scaling(runs)
    assert scaling.rows == [["bert", "jax", "bf16", "gpu", "90.0%*"]]  # 180 / (2 x 100)
    assert [c.path.name for c in charts.draw(runs, tmp_path)] == [
        "throughput-train-bf16.png", "throughput-pipeline-bf16.png", "scaling.png"]
    # House rule: only fxtrack.tracking imports mlflow.
    package = Path(select.__file__).parent
    assert not [p.name for p in package.glob("*.py")
                if re.search(r"^\s*(import|from)\s+mlflow", p.read_text(), re.MULTILINE)]


def test_min_repeats_refuses_to_rank_single_runs(store, tmp_path, capsys):
    code, out, err = report(capsys, "--uri", store, "--out", str(tmp_path / "r"), "--no-log",
                            "--min-repeats", "3")
    assert code == 0, err
    assert "Verdict (throughput vs the best): train, fp32, x1, cpu" in out
    assert "not ranked: 1 repeat(s) < --min-repeats 3" in out
    code, out, _ = report(capsys, "--uri", store, "--out", str(tmp_path / "r"), "--no-log")
    assert "jax fastest; single runs, no interval (use repeats=3)" in out


def test_aggregates_stand_for_their_repeats_with_intervals_and_verdicts(tmp_path):
    """A 3-repeat sweep as MLflow holds it: per framework an aggregate run (median, interval,
    log stats) and three repeat runs under it; the report ranks the aggregates only."""
    from fxtrack.orchestrator import repeats
    from fxtrack.report import charts, render, select, tables, verdicts

    samples = {"torch": [60.0, 62.0, 61.0], "tensorflow": [100.0, 98.0, 101.0],
               "jax": [97.0, 103.0, 99.0]}
    rows, n = [], 0
    for fw, values in samples.items():
        base = {"status": "FINISHED", "tags.fxtrack.framework": fw, "tags.fxtrack.model": "vit",
                "tags.fxtrack.scenario": "train", "tags.fxtrack.precision": "fp32",
                "tags.fxtrack.devices": "1", "tags.fxtrack.hardware": "cpu",
                "tags.fxtrack.status": "ok", "tags.fxtrack.host": "h"}
        for i, v in enumerate(values):
            n += 1
            rows.append(dict(base, run_id=f"r{n}", **{"tags.fxtrack.repeat": str(i),
                        "tags.fxtrack.repeat_of": f"agg-{fw}", "metrics.throughput_samples_per_s": v},
                             start_time=pd.Timestamp(T0 + n, unit="ms", tz="UTC"),
                             end_time=pd.Timestamp(T0 + n + 1, unit="ms", tz="UTC")))
        agg = repeats.aggregate_metrics([{"throughput_samples_per_s": v} for v in values])
        n += 1
        rows.append(dict(base, run_id=f"agg-{fw}", **{"tags.fxtrack.kind": "aggregate",
                    "tags.fxtrack.repeats": "3",
                    "tags.fxtrack.contended": "true" if fw == "jax" else "false"},
                         **{f"metrics.{k}": v for k, v in agg.items()},
                         start_time=pd.Timestamp(T0 + n, unit="ms", tz="UTC"),
                         end_time=pd.Timestamp(T0 + n + 1, unit="ms", tz="UTC")))
    selection = select.latest_runs(pd.DataFrame(rows))
    runs = selection.runs
    assert sorted(runs["run_id"]) == ["agg-jax", "agg-tensorflow", "agg-torch"]
    assert selection.skipped["repeats counted in their aggregate"] == 9
    assert set(runs["repeats"]) == {3}
    (thr,) = tables.throughput(runs)
    assert thr.rows[0][1].startswith("61.0 ±") and thr.rows[0][1].endswith("(0.61x)")
    (verdict,) = verdicts.table(runs, min_repeats=3)
    cells = dict(zip(verdict.header, verdict.rows[0]))
    assert cells["tensorflow"] == "1.00x"
    assert re.fullmatch(r"0\.61x \[0\.\d\d, 0\.\d\d\]", cells["torch"])
    assert "c" in cells["jax"].split()[-1]  # contended (and noisy: a 3-repeat interval > 10%)
    assert cells["verdict"] == ("tensorflow fastest; no clear difference with jax "
                                "(contended: re-measure on a quiet machine)")
    text = render.text([verdict])  # wrapped to 100 columns (issue 42), the words kept
    assert "tensorflow fastest;" in text and max(map(len, text.splitlines())) <= 100
    assert [c.path.name for c in charts.draw(runs, tmp_path)] == ["throughput-train-fp32.png"]


def test_lever_variants_stay_out_of_the_main_tables():
    """An ONNX Runtime int8 run of the same benchmark, logged later, must not stand in the main
    tables for the native run: it belongs to the deployment table."""
    from fxtrack.report import select

    base = {"status": "FINISHED", "tags.fxtrack.framework": "torch", "tags.fxtrack.model": "resnet50",
            "tags.fxtrack.scenario": "inference", "tags.fxtrack.precision": "fp32",
            "tags.fxtrack.devices": "1", "tags.fxtrack.hardware": "cpu", "tags.fxtrack.status": "ok",
            "params.runtime": "native", "params.quantize": "none"}
    rows = [dict(base, run_id="native", **{"metrics.throughput_samples_per_s": 10.0},
                 start_time=pd.Timestamp(T0, unit="ms", tz="UTC"),
                 end_time=pd.Timestamp(T0 + 1, unit="ms", tz="UTC")),
            dict(base, run_id="ort-int8", **{"params.runtime": "onnxruntime",
                                              "params.quantize": "dynamic_int8",
                                              "metrics.throughput_samples_per_s": 90.0},
                 start_time=pd.Timestamp(T0 + 2, unit="ms", tz="UTC"),
                 end_time=pd.Timestamp(T0 + 3, unit="ms", tz="UTC"))]
    selection = select.latest_runs(pd.DataFrame(rows))
    assert list(selection.runs["run_id"]) == ["native"]
    assert selection.skipped["lever variants (deployment / memory tables)"] == 1


def test_pages_escape_cells_and_set_inline_code_as_code():
    """Figures right-aligned in every renderer; HTML escaped; the reST inline code of
    docstring-made intros becomes <code> / Markdown code, never literal double backticks."""
    from fxtrack.report import render, tables

    table = tables.Table("Throughput <x1>", ["model", "torch"],
                         [["a|b<i>", "1,234.5"], ["vit", "-"]], ["see ``--min-repeats N``"])
    report = render.Report("r", [], [tables.Section("Verdicts", [table],
                                                    "``--min-repeats N`` refuses to rank")], [])
    page = render.html_page(report)
    assert "<code>--min-repeats N</code> refuses" in page and "``" not in page
    assert "a|b&lt;i&gt;" in page and "<i>" not in page and "Throughput &lt;x1&gt;" in page
    assert '<td style="text-align: right;">1,234.5</td>' in page
    md = render.markdown(report)
    # report.md escapes what the page escapes (issue 43): Markdown passes raw HTML through
    assert "`--min-repeats N` refuses" in md and "``" not in md and "a\\|b&lt;i&gt;" in md
    assert "<i>" not in md
    assert re.search(r"^\|:-+\|-+:\|$", md, re.MULTILINE)  # model left, figures right
    text = render.text_table(table).splitlines()
    assert text[0] == "Throughput <x1>" and text[-1] == "  see ``--min-repeats N``"
    assert text[3].endswith("1,234.5") and text[4].endswith("      -")  # right-aligned, uncut


def test_each_keras_backend_is_a_column_of_its_own_after_the_native_frameworks():
    """framework=keras on jax and on torch are different measurements: neither supersedes the
    other, and both stand after the native frameworks, in the declared order."""
    from fxtrack.report import select

    base = {"status": "FINISHED", "tags.fxtrack.model": "vit", "tags.fxtrack.scenario": "train",
            "tags.fxtrack.precision": "fp32", "tags.fxtrack.devices": "1",
            "tags.fxtrack.hardware": "cpu", "tags.fxtrack.status": "ok"}
    rows = [dict(base, run_id=run_id, **{"tags.fxtrack.framework": fw,
                                         "metrics.throughput_samples_per_s": 1.0 + i},
                 **({"tags.fxtrack.keras_backend": kb} if kb else {}),
                 start_time=pd.Timestamp(T0 + 2 * i, unit="ms", tz="UTC"),
                 end_time=pd.Timestamp(T0 + 2 * i + 1, unit="ms", tz="UTC"))
            for i, (run_id, fw, kb) in enumerate([("k-torch", "keras", "torch"),
                                                  ("k-jax", "keras", "jax"),
                                                  ("jax", "jax", None), ("torch", "torch", None)])]
    runs = select.latest_runs(pd.DataFrame(rows)).runs
    assert select.frameworks(runs) == ["torch", "jax", "keras-jax", "keras-torch"]
    assert len(runs) == 4


def test_the_memory_table_marks_a_jax_run_that_held_its_state_twice():
    """framework.donate=false keeps JAX's old parameters and optimiser state beside the new ones
    (issue 25 item 12): its peak is not comparable unmarked."""
    from fxtrack.report import select, tables

    base = {"status": "FINISHED", "tags.fxtrack.model": "vit", "tags.fxtrack.scenario": "train",
            "tags.fxtrack.precision": "fp32", "tags.fxtrack.devices": "1",
            "tags.fxtrack.hardware": "cpu", "tags.fxtrack.status": "ok"}
    rows = [dict(base, run_id=fw, **{"tags.fxtrack.framework": fw, "metrics.peak_rss_mib": rss},
                 **({"tags.fxtrack.jax_donation": donation} if donation else {}),
                 start_time=pd.Timestamp(T0 + i, unit="ms", tz="UTC"),
                 end_time=pd.Timestamp(T0 + i + 1, unit="ms", tz="UTC"))
            for i, (fw, rss, donation) in enumerate([("torch", 900.0, None),
                                                     ("jax", 2079.0, "off (framework.donate=false)")])]
    (table,) = tables.memory(select.latest_runs(pd.DataFrame(rows)).runs)
    cells = dict(zip(table.header, table.rows[0]))
    assert cells["jax"].startswith("2,079 RSS 2x") and "2x" not in cells["torch"]
    assert any("held twice" in note for note in table.notes)
    rows[1]["tags.fxtrack.jax_donation"] = "state donated on cpu"
    (table,) = tables.memory(select.latest_runs(pd.DataFrame(rows)).runs)
    assert "2x" not in dict(zip(table.header, table.rows[0]))["jax"]
