"""``fxtrack report``: read the runs from MLflow, print the throughput table, write the report
files and, with ``--log``, log them as the artifacts of a run named ``report`` in an experiment
of their own (``fxtrack-reports`` by default), never among the benchmark runs."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

FORMATS = ("md", "html", "csv")
PROG = "fxtrack report"
REPORTS_EXPERIMENT = "fxtrack-reports"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Comparison tables and charts from the fxtrack runs in MLflow: "
        "the latest finished run per framework, model, scenario, precision, device count and "
        "hardware.")
    parser.add_argument("--experiment", default="fxtrack",
                        help="MLflow experiment (default: %(default)s)")
    parser.add_argument("--uri", help="tracking URI (default: $MLFLOW_TRACKING_URI, else "
                        "sqlite:///<current directory>/mlflow.db)")
    parser.add_argument("--filter", help="MLflow search filter, e.g. "
                        "\"tags.`fxtrack.model` = 'vit' and params.batch_size = '32'\"")
    parser.add_argument("--out", type=Path, default=Path("fxtrack-report"),
                        help="output directory (default: ./%(default)s)")
    parser.add_argument("--format", default=",".join(FORMATS),
                        help="comma-separated files to write, of md, html, csv "
                        "(default: %(default)s)")
    parser.add_argument("--min-repeats", type=int, default=1, metavar="N",
                        help="refuse to rank (verdict) a row where any framework's figure "
                        "stands on fewer than N repeats (default: %(default)s)")
    parser.add_argument("--log", nargs="?", const=REPORTS_EXPERIMENT, metavar="EXPERIMENT",
                        help="also log the report files as an MLflow run named 'report' in "
                        "EXPERIMENT (default: %(const)s; the benchmark experiment keeps only "
                        "benchmark runs)")
    parser.add_argument("--ui-url", metavar="URL",
                        help="the MLflow UI the page's run links open (default: the tracking "
                        "server when --uri is one, else http://127.0.0.1:5000, what `fxtrack ui` "
                        "serves)")
    parser.add_argument("--suite", type=Path, metavar="FILE",
                        help="a YAML list of the cells the 'Across the suite' verdict stands on, "
                        "each {objective, model, weight} (default: every cell of the page)")
    parser.add_argument("--no-log", action="store_true",
                        help="do not log the report (the default; kept for old scripts)")
    args = parser.parse_args(argv)
    args.formats = [f.strip() for f in args.format.split(",") if f.strip()]
    unknown = [f for f in args.formats if f not in FORMATS]
    if unknown or not args.formats:
        parser.error(f"--format takes a comma-separated list of {', '.join(FORMATS)}; "
                     f"got {args.format!r}")
    return args


def main(argv: list[str]) -> int:
    """Run the report; 0 on success, 1 (with one line on stderr) when there is nothing to report."""
    args = parse_args(argv)
    weights = None
    if args.suite is not None:  # a bad file is said before any work
        from fxtrack.report.suite import read_weights

        try:
            weights = read_weights(args.suite)
        except ValueError as e:
            print(f"{PROG}: {e}", file=sys.stderr)
            return 2
    # Imported here so that `fxtrack report --help` answers without loading MLflow or matplotlib.
    from fxtrack.environment import redact_uri_text
    from fxtrack.report import (charts, claims, cost, levers, lm, render, samples, tables, trend,
                                verdicts)
    from fxtrack.tracking import reader, target

    uri = target.tracking_uri(args.uri, os.getcwd())  # credentials moved out (issue 60)
    try:
        frame = reader.load_runs(uri, args.experiment, args.filter)
    except reader.ExperimentNotFound as e:
        held = reader.experiment_names(uri)
        hint = (f"; the store holds {', '.join(map(repr, held))} (choose with --experiment)"
                if held else "")
        print(f"{PROG}: {e}{hint}", file=sys.stderr)
        return 1
    except reader.ReadError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    selection = samples.standing(frame)  # every figure as the one figure function pools it
    if selection.runs.empty:
        print(f"{PROG}: no finished benchmark runs in experiment {args.experiment!r}: "
              f"{selection.summary()}", file=sys.stderr)
        return 1
    runs = selection.runs

    out = args.out.resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK):
            raise PermissionError(f"cannot write in {out}")
    except OSError as e:  # a file in its place, no permission, a read-only mount
        print(f"{PROG}: --out {args.out}: cannot write the report there "
              f"({type(e).__name__}: {e.strerror or e}): choose another --out", file=sys.stderr)
        return 1
    # Charts are only seen through the Markdown and HTML pages; a CSV-only report skips them.
    drawn = (charts.draw(runs, out) + trend.charts(frame, out)
             + scenario_charts(frame, runs, out,
                               lambda ids, keys: reader.metric_histories(uri, ids, keys))
             if {"md", "html"} & set(args.formats) else [])
    source = f"experiment {args.experiment!r} at {redact_uri_text(uri)}"
    meta = [source + (f", filter {args.filter!r}" if args.filter else ""), selection.summary(),
            f"generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
            "each figure is the latest finished run or repeats=N group of one identity "
            "(every logged key but those declared apart), a group's figures pooled from its "
            "repeats by the one figure function (report/samples.py); separate runs are never "
            "pooled as repeats"]
    verdict = verdicts.table(runs, args.min_repeats)
    sections = tables.sections(runs) + [s for s in [lm.section(frame, runs)] if s]
    sections += scenario_sections(runs, frame)  # each scenario's own (fit's search, serving)
    sections += levers.sections(frame)  # levers: every variant, raw frame
    sections += cost.section(runs) + [s for s in [claims.section(frame)] if s]
    if verdict:
        sections.insert(1, tables.Section("Verdicts", verdict, verdicts.__doc__.split("\n\n")[1]
                                          .replace("\n", " ")))
    lead, lead_html, sentences, tradeoffs = _answer(frame, out, uri, args.ui_url,
                                                    draw={"md", "html"} & set(args.formats),
                                                    weights=weights)
    report = render.Report(f"fxtrack report: {args.experiment}", meta, sections, drawn, lead,
                           lead_html, tradeoffs)

    print(f"{PROG}: {source}: {selection.summary()}\n")
    if lead:
        print(render.text([t for section in lead for t in section.tables]) + "\n")
    throughput = tables.throughput(runs)
    print(render.text(throughput) if throughput else "(no throughput figures among the kept runs)")
    if verdict:
        print("\n" + render.text(verdict))
    if sentences:
        print("\nThe answer in words:\n" + "\n".join(f"- {line}" for line in sentences))
    files = render.write(report, runs, out, args.formats)
    names = [p.name for p in files] + [c.path.name for c in drawn + tradeoffs]
    print(f"\n{PROG}: wrote {', '.join(names)} to {out}", file=sys.stderr)
    if args.log and not args.no_log:
        _log(uri, args, selection, files + [c.path for c in drawn + tradeoffs])
    return 0


def _answer(frame, out: Path, uri: str, ui_url, draw,
            weights=None) -> tuple[list, str, list[str], list]:
    """The answer section (tables for text and Markdown, linked HTML for the page) and its
    verdict sentences, the verdict across the suite first; charts drawn only where a page
    shows them."""
    from fxtrack.report import answer, page, pareto, suite
    from fxtrack.report.tables import Section

    blocks, missing = answer.blocks(frame)
    if not blocks and not missing:
        return [], "", [], []
    across = suite.suites(blocks, weights)
    first = [suite.table(s) for s in across]
    tables = first + [page.table(b) for b in blocks]
    code = page.code_size_table(sorted({b.best.framework for b in blocks}
                                       | {e.framework for b in blocks for e in b.entries}))
    tables += [code] if code else []
    gaps = page.missing_table(missing)
    drawn = pareto.charts(frame, out) if draw else []
    profiles = [suite.chart(s, out) for s in across] if draw else []
    section = Section("The answer", tables + ([gaps] if gaps else []))
    experiment_id = str(frame["experiment_id"].iloc[0]) if "experiment_id" in frame and len(frame) else "0"
    html_text = page.html_blocks(blocks, missing, page.ui_base(uri, ui_url), experiment_id, drawn,
                                 [code] if code else [], first, profiles)
    sentences = ([t.notes[0] for t in first] + [answer.sentence(b) for b in blocks]
                 + (code.notes if code else []))
    return [section], html_text, sentences, drawn + profiles


def _log(uri: str, args: argparse.Namespace, selection, files: list[Path]) -> None:
    """Log the report files as a run named ``report`` in ``--log``'s experiment through the one
    MLflow writer. The run has ``fxtrack.kind=report`` and no ``fxtrack.framework`` tag, so that
    a report of that experiment does not read it as a benchmark either."""
    from fxtrack.tracking import records, writer

    params = {"format": ",".join(args.formats), "runs_read": selection.read,
              "runs_kept": len(selection.runs), "experiment": args.experiment}
    if args.filter:
        params["filter"] = args.filter
    if args.log == args.experiment:
        print(f"{PROG}: --log {args.log!r} is the benchmark experiment itself: the report run "
              f"goes to {REPORTS_EXPERIMENT!r} instead", file=sys.stderr)
        args.log = REPORTS_EXPERIMENT if args.experiment != REPORTS_EXPERIMENT else None
        if args.log is None:
            return
    record = records.report_record(uri, args.log, params)
    run_id, _, message = writer.log_record(record, {path.name: path for path in files}, uri)
    if run_id is None:
        print(f"{PROG}: the report run: {(message or '').removeprefix('fxtrack: ')}",
              file=sys.stderr)
        return
    print(f"{PROG}: logged the files as MLflow run {run_id} (run name 'report') in experiment "
          f"{args.log!r}", file=sys.stderr)


def scenario_sections(runs: Any, frame: Any) -> list[Any]:
    """The report sections the scenarios declare (each one's ``section`` part), in the
    registry's order, each given the kept runs and the whole frame; a scenario without runs adds
    none."""
    from fxtrack import scenarios

    made = (section(runs, frame) for _, section in scenarios.with_part("section"))
    return [section for section in made if section]


def scenario_charts(frame: Any, runs: Any, out: Path, histories: Any) -> list[Any]:
    """The charts the scenarios' sections draw (``section.charts``), in the registry's order:
    ``histories`` (run ids, keys) -> each run's metric series, read only when one asks."""
    from fxtrack import scenarios

    return [chart for _, draw in scenarios.with_part("section", "charts")
            for chart in draw(frame, runs, out, histories)]
