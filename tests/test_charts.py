"""The report's throughput charts say what their bars are (issue 21, item 8): intervals only where
repeats > 1, n= on every bar, contended bars marked, the model size stated, in the figure and in
the Markdown/HTML caption."""

from __future__ import annotations

import pandas as pd
import pytest

from fxtrack.report import charts, render, select

T0 = 1_700_000_000_000


def frame(repeats: int, contended: str = "false", size: str | None = "tiny") -> pd.DataFrame:
    """A search_runs frame: torch and jax ViT train runs (aggregates of ``repeats`` when > 1);
    jax's run contended as given."""
    rows = []
    for n, (fw, thr) in enumerate((("torch", 60.0), ("jax", 250.0))):
        row = {"run_id": f"r{n}", "status": "FINISHED",
               "start_time": pd.Timestamp(T0 + n, unit="ms", tz="UTC"),
               "end_time": pd.Timestamp(T0 + n + 1, unit="ms", tz="UTC"),
               "tags.fxtrack.framework": fw, "tags.fxtrack.model": "vit",
               "tags.fxtrack.scenario": "train", "tags.fxtrack.precision": "fp32",
               "tags.fxtrack.devices": "1", "tags.fxtrack.hardware": "cpu",
               "tags.fxtrack.status": "ok",
               "tags.fxtrack.contended": contended if fw == "jax" else "false",
               "metrics.throughput_samples_per_s": thr,
               "metrics.system/cpu_utilization_percentage": 50.0}
        if size:
            row["params.size.name"] = size
        if repeats > 1:
            row.update({"tags.fxtrack.kind": "aggregate", "tags.fxtrack.repeats": str(repeats),
                        "metrics.throughput_ci_low": thr * 0.9,
                        "metrics.throughput_ci_high": thr * 1.1})
        rows.append(row)
    return pd.DataFrame(rows)


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """Draw the charts of a frame; returns (charts, the figures as drawn, before closing)."""
    figures = []
    monkeypatch.setattr(charts.plt, "close", figures.append)

    def draw(runs_frame):
        runs = select.latest_runs(runs_frame).runs
        return charts.throughput_charts(runs, tmp_path), figures

    return draw


def texts(fig) -> tuple[list[str], list[str], str, str]:
    """(bar annotations, legend labels, title, y label) of a bar chart figure."""
    (ax,) = fig.axes
    return ([t.get_text() for t in ax.texts], [t.get_text() for t in ax.get_legend().get_texts()],
            ax.get_title(), ax.get_ylabel())


def test_single_runs_have_no_interval_and_say_n_1_and_the_model_size(drawn):
    (chart,), (fig,) = drawn(frame(repeats=1))
    notes, legend, title, ylabel = texts(fig)
    assert notes == ["60\nn=1", "250\nn=1"]  # torch, jax: value and how many runs
    assert "interval" not in " ".join(legend) + ylabel
    assert not [c for c in fig.axes[0].containers if type(c).__name__ == "ErrorbarContainer"]
    assert title == chart.title == "Throughput: train, fp32, x1, cpu, tiny models"
    assert "no intervals (every bar is a single run" in chart.caption
    assert "95%" not in chart.caption and "contended" not in chart.caption
    assert "tiny models (a few layers" in chart.caption


def test_repeats_show_their_interval_and_contended_bars_are_marked(drawn):
    (chart,), (fig,) = drawn(frame(repeats=3, contended="true", size="full"))
    notes, legend, title, _ = texts(fig)
    assert notes == ["60\nn=3", "250*\nn=3"]
    assert "95% interval of the median" in legend and "* contended (busy cores)" in legend
    assert title.endswith(", full models")
    assert "whiskers: the 95% interval of the repeats' median" in chart.caption
    assert charts.CONTENDED_NOTE in chart.caption and "full-size models" in chart.caption
    # the whiskers drawn are the interval: 10% either side of jax's 250
    (_, jax_bars) = [c for c in fig.axes[0].containers if type(c).__name__ == "ErrorbarContainer"]
    segments = jax_bars.lines[2][0].get_segments()
    assert [round(y) for y in segments[0][:, 1]] == [225, 275]


def test_mixed_sizes_label_each_bar_group_and_an_unlogged_size_says_so(drawn):
    tiny, full = frame(1, size="tiny"), frame(1, size="full")
    full = full.assign(**{"tags.fxtrack.model": "bert", "run_id": ["f0", "f1"]})
    (chart,), (fig,) = drawn(pd.concat([tiny, full], ignore_index=True))
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["BERT-base", "vit tiny"]  # named by the dims that ran
    assert "model sizes as labelled" in chart.caption and "models" not in chart.title
    (chart,), _ = drawn(frame(1, size=None))
    assert "model size not logged" in chart.caption


def test_the_caption_is_under_the_chart_in_markdown_and_html_without_literal_markup(drawn):
    (chart,), _ = drawn(frame(repeats=3, contended="true"))
    report = render.Report("r", ["meta"], [], [chart])
    md = render.markdown(report)
    assert f"![{chart.title}]({chart.path.name})\n\n*Bars: samples/s" in md
    assert r"\* contended" in md  # a literal asterisk, not the end of the emphasis
    page = render.html_page(report)
    assert f"<figcaption>{chart.title}<br>Bars: samples/s" in page
    assert "``" not in page and "``" not in md


def test_sampled_system_series_are_not_report_metrics():
    runs = select.latest_runs(frame(1)).runs
    assert not [c for c in runs.columns if "system/" in c]


def test_deployment_cells_are_not_cut_mid_word():
    from fxtrack.report import levers

    long = ("NotSupported: runtime=tensorrt is not supported by torch 2.13 on a CPU-only machine "
            "without the TensorRT libraries: install torch-tensorrt on a CUDA host")
    row = pd.Series({"unsupported": True, "error": long, "status": "FAILED"})
    assert levers._state(row) == ("not supported by torch 2.13 on a CPU-only machine without "
                                  "the TensorRT libraries")
    row = pd.Series({"unsupported": False, "status": "FAILED",
                     "error": "RuntimeError: " + " ".join(["overflowing"] * 20)})
    cell = levers._state(row)
    assert cell.endswith("overflowing ...") and len(cell) <= len("FAILED: ") + 90


def test_a_wide_whisker_is_drawn_to_the_cap_and_marked_never_flattening_the_bars(drawn):
    wide = frame(repeats=3)
    wide.loc[0, "metrics.throughput_ci_high"] = 60.0 * 50  # torch's interval: up to 3,000
    (_, ), (fig,) = drawn(wide)
    notes, legend, _, _ = texts(fig)
    (ax,) = fig.axes
    assert ax.get_ylim()[1] <= charts.WHISKER_CAP * 250 * 1.2  # jax's 250 stays readable
    assert notes[0] == "60\nn=3\n\u25b2 to 3e+03" and notes[1] == "250\nn=3"
    assert any("drawn to the cap" in label for label in legend)
    (torch_bars, _) = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert max(torch_bars.lines[2][0].get_segments()[0][:, 1]) == pytest.approx(
        charts.WHISKER_CAP * 250)
