"""Render the report's tables and charts as terminal text, Markdown, self-contained HTML and CSV."""

from __future__ import annotations

import base64
import dataclasses
import html
import re
from pathlib import Path

import pandas as pd

from fxtrack.report.charts import Chart
from fxtrack.report.select import KEY
from fxtrack.report.tables import Section, Table

# The CSV's leading columns; every metric the kept runs logged follows them.
CSV_COLUMNS = [*KEY, "check", "guard", "run_name", "run_id", "start_time", "device",
               "framework_version", "host", "repeats", "contended", "noisy"]


_FIGURE = re.compile(r"^-?[\d.,]+")


@dataclasses.dataclass
class Report:
    title: str
    meta: list[str]  # one line each: where the runs came from, what was kept
    sections: list[Section]
    charts: list[Chart]


def numeric(table: Table) -> list[bool]:
    """Which columns hold figures: those are right-aligned so that their digits line up."""
    return [i > 0 and all(_FIGURE.match(row[i]) or row[i] == "-" for row in table.rows)
            for i in range(len(table.header))]


def text_table(table: Table) -> str:
    """A fixed-width table with its title and notes, for the terminal."""
    rows = [table.header, *table.rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(table.header))]
    right = numeric(table)
    line = lambda r: "  ".join(c.rjust(w) if right[i] else c.ljust(w)  # noqa: E731
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip()
    out = [table.title, line(table.header), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in table.rows]
    out += [f"  {note}" for note in table.notes]
    return "\n".join(out)


def text(tables: list[Table]) -> str:
    return "\n\n".join(text_table(t) for t in tables)


def _md_cell(value: str) -> str:
    return value.replace("|", "\\|")


def markdown(report: Report) -> str:
    """Markdown with the charts linked as files beside it."""
    out = [f"# {report.title}", "", *[f"- {line}" for line in report.meta], ""]
    if report.charts:
        out += ["## Charts", ""]
        out += [f"![{c.title}]({c.path.name})\n" for c in report.charts]
    for section in report.sections:
        out += [f"## {section.title}", ""]
        if section.intro:
            out += [section.intro, ""]
        for table in section.tables:
            out += [f"### {table.title}", "",
                    "| " + " | ".join(map(_md_cell, table.header)) + " |",
                    "|" + "|".join(" ---: " if r else " --- " for r in numeric(table)) + "|"]
            out += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in table.rows]
            out += [""] + [f"*{_md_cell(note)}*  " for note in table.notes] + [""]
    return "\n".join(out).rstrip() + "\n"


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto;
       max-width: 72rem; padding: 0 1rem; color: #1f2328; line-height: 1.45; }
h1 { border-bottom: 2px solid #d0d7de; padding-bottom: .3rem; }
h2 { margin-top: 2.2rem; border-bottom: 1px solid #d0d7de; padding-bottom: .2rem; }
h3 { font-size: 1rem; margin-bottom: .4rem; }
ul.meta { color: #57606a; }
table { border-collapse: collapse; margin: .3rem 0 .4rem; font-size: .92rem; }
th, td { border: 1px solid #d0d7de; padding: .3rem .7rem; }
th { background: #f6f8fa; text-align: left; }
td { white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th.num { text-align: right; }
td:first-child { font-weight: 600; }
tr:nth-child(even) td { background: #fafbfc; }
p.note { color: #57606a; font-size: .85rem; margin: .1rem 0; }
figure { display: inline-block; margin: .5rem 1rem .5rem 0; }
figure img { max-width: 100%; border: 1px solid #d0d7de; }
figcaption { color: #57606a; font-size: .85rem; }
"""


def _html_table(table: Table) -> str:
    esc = html.escape
    cls = [' class="num"' if r else "" for r in numeric(table)]
    head = "".join(f"<th{k}>{esc(h)}</th>" for h, k in zip(table.header, cls))
    body = "".join("<tr>" + "".join(f"<td{k}>{esc(c)}</td>" for c, k in zip(row, cls)) + "</tr>"
                   for row in table.rows)
    notes = "".join(f'<p class="note">{esc(n)}</p>' for n in table.notes)
    return (f"<h3>{esc(table.title)}</h3>\n<table><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>\n{notes}\n")


def html_page(report: Report) -> str:
    """One self-contained page: styles inline, charts embedded as base64 PNGs."""
    esc = html.escape
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
             f"<title>{esc(report.title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{esc(report.title)}</h1>",
             '<ul class="meta">' + "".join(f"<li>{esc(m)}</li>" for m in report.meta) + "</ul>"]
    if report.charts:
        parts.append("<h2>Charts</h2>")
        for chart in report.charts:
            data = base64.b64encode(chart.path.read_bytes()).decode("ascii")
            parts.append(f'<figure><img alt="{esc(chart.title)}" '
                         f'src="data:image/png;base64,{data}"><figcaption>{esc(chart.title)}'
                         "</figcaption></figure>")
    for section in report.sections:
        parts.append(f"<h2>{esc(section.title)}</h2>")
        if section.intro:
            parts.append(f"<p>{esc(section.intro)}</p>")
        parts += [_html_table(t) for t in section.tables]
    parts.append("</body></html>\n")
    return "\n".join(parts)


def csv_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """The kept runs' identity, provenance and every metric they logged, one row per run.

    ``status`` is the fxtrack.status tag (ok / guard_failed): every kept run FINISHED in MLflow.
    """
    metrics = sorted(c for c in runs.columns if c.startswith("metrics."))
    frame = runs[[c for c in CSV_COLUMNS if c in runs.columns] + metrics]
    return frame.rename(columns={"check": "status", **{c: c[len("metrics."):] for c in metrics}})


def write(report: Report, runs: pd.DataFrame, out: Path, formats: list[str]) -> list[Path]:
    """Write ``report.<format>`` for each format under ``out``; returns the files written."""
    written = []
    for fmt in formats:
        path = out / f"report.{fmt}"
        if fmt == "md":
            path.write_text(markdown(report), encoding="utf-8")
        elif fmt == "html":
            path.write_text(html_page(report), encoding="utf-8")
        elif fmt == "csv":
            csv_frame(runs).to_csv(path, index=False)
        written.append(path)
    return written
