"""Render the report's tables and charts as terminal text, Markdown, self-contained HTML and CSV."""

from __future__ import annotations

import base64
import dataclasses
import html
import re
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import pandas as pd
from tabulate import tabulate

from fxtrack.report.select import KEY
from fxtrack.report.tables import Section, Table

if TYPE_CHECKING:  # charts loads matplotlib; a closing table in the orchestrator needs none of it
    from fxtrack.report.charts import Chart

# The CSV's leading columns; every metric the kept runs logged follows them.
CSV_COLUMNS = [*KEY, "check", "guard", "run_name", "run_id", "start_time", "device",
               "framework_version", "host", "repeats", "contended", "noisy"]


_FIGURE = re.compile(r"^-?[\d.,]+")
_CODE = re.compile(r"``(.+?)``")


@dataclasses.dataclass
class Report:
    title: str
    meta: list[str]  # one line each: where the runs came from, what was kept
    sections: list[Section]
    charts: list[Chart]
    # the answer (report/answer.py): before the charts and detail tables in every format; the
    # page renders it from ``lead_html`` (figures linked to their runs) where that is set
    lead: list[Section] = dataclasses.field(default_factory=list)
    lead_html: str = ""
    lead_charts: list = dataclasses.field(default_factory=list)  # the answer's Pareto charts


def numeric(table: Table) -> list[bool]:
    """Which columns hold figures: those are right-aligned so that their digits line up."""
    return [i > 0 and all(_FIGURE.match(row[i]) or row[i] == "-" for row in table.rows)
            for i in range(len(table.header))]


def _grid(table: Table, fmt: str, cell=lambda c: c, widths: Optional[list] = None) -> str:
    """The table's header and rows through tabulate: cells kept as written (no number parsing,
    never cut; wrapped where ``widths`` says), figures right-aligned."""
    align = ["right" if r else "left" for r in numeric(table)]
    limits = widths or [None] * len(table.header)
    # wrapped here, not by tabulate's maxcolwidths: its wrapping parses a cell such as '1,385.0'
    # as a number whatever disable_numparse says (tabulate 0.9), and raises
    rows = [[_wrap(cell(c), w) for c, w in zip(row, limits)] for row in table.rows]
    # tabulate pads a header by 2 (its MIN_PADDING), as fit_widths counts it
    header = [_wrap(cell(h), w and max(w - 2, 1)) for h, w in zip(table.header, limits)]
    return tabulate(rows, header,
                    tablefmt=fmt, colalign=align, disable_numparse=True)


def _wrap(text, width: Optional[int]):
    """``text``'s lines wrapped at ``width`` (at spaces and hyphens, a longer word cut)."""
    if width is None or not isinstance(text, str):
        return text
    return "\n".join("\n".join(textwrap.wrap(line, width)) or line for line in text.splitlines())


WIDTH = 100  # a terminal table's most columns: wider cells wrap (never cut)


def fit_widths(table: Table, width: int = WIDTH, narrowest: int = 12) -> Optional[list]:
    """Each column's wrap width so that the table fits ``width`` columns (None: as it is): the
    column of the longest cells that can still give gives a character at a time, never below
    ``narrowest`` nor its longest word (a name, an id, a figure whole) unless the table cannot
    fit otherwise; a column of commands never wraps."""
    cols = [[str(c) for c in col] for col in zip(table.header, *table.rows)]
    # tabulate keeps 2 spaces of padding beside a header (its MIN_PADDING)
    natural = [max(len(line) + 2 * (i == 0) for i, c in enumerate(col)
                   for line in c.splitlines() or [""]) for col in cols]
    # a name wraps at its hyphens (tensorflow-vit-inference-...), a sentence at its spaces
    floor = [min(n, max(narrowest, max(len(w) + 2 * (i == 0) for i, c in enumerate(col)
                                       for w in re.split(r"[\s-]+", c) or [""])))
             for n, col in zip(natural, cols)]
    # a command stays on one line, to paste whole, and so does a column the table keeps whole
    # (a status: "NOT SUPPORTED" split over two lines reads as two words); the table runs wider
    floor = [n if col[0] in table.whole or any(c.startswith("python -m ") for c in col[1:])
             else f for n, f, col in zip(natural, floor, cols)]
    mean = [sum(map(len, col[1:])) / max(len(col) - 1, 1) for col in cols]
    limits = list(natural)
    for least in (floor, [f if f == n else min(n, narrowest) for f, n in zip(floor, natural)]):
        while sum(limits) + 2 * (len(limits) - 1) > width:
            can = [k for k in range(len(limits)) if limits[k] > least[k]]
            if not can:
                break
            # prose gives first: the column whose cells are longest on average
            limits[max(can, key=lambda k: (min(limits[k], mean[k]), limits[k]))] -= 1
    return None if limits == natural else [lim if lim < n else None for lim, n in zip(limits, natural)]


def text_table(table: Table) -> str:
    """A fixed-width table with its title and notes, for the terminal, within ``WIDTH`` columns."""
    grid = _grid(table, "simple", widths=fit_widths(table)) if table.rows else _grid(table, "simple")
    lines = [line.rstrip() for line in grid.splitlines()]
    notes = [textwrap.fill(note, WIDTH, initial_indent="  ", subsequent_indent="    ",
                           break_on_hyphens=False) for note in table.notes]
    return "\n".join([table.title, *lines, *notes])


def text(tables: list[Table]) -> str:
    return "\n\n".join(text_table(t) for t in tables)


def _md(value: str) -> str:
    """Text in Markdown as the page escapes it in HTML: a model, experiment or tag name holding
    ``<script>`` stays text (Markdown passes raw HTML through), a literal | would end a table
    cell, a newline a row."""
    return html.escape(str(value), quote=False).replace("|", "\\|").replace("\n", " ")


def _md_title(value: str) -> str:
    """A chart's title inside ``![...]``: escaped, and its brackets literal."""
    return _md(value).replace("[", "\\[").replace("]", "\\]")


def _md_text(value: str) -> str:
    """Prose from docstrings writes inline code reST-style (two backticks); Markdown uses one."""
    return _CODE.sub(r"`\1`", value)


def markdown(report: Report) -> str:
    """Markdown with the charts linked as files beside it."""
    out = [f"# {_md(report.title)}", "", *[f"- {_md(line)}" for line in report.meta], ""]
    out += _md_sections(report.lead)
    for c in report.lead_charts:
        out += [f"![{_md_title(c.title)}]({c.path.name})", "",
                "*" + _md(c.caption).replace("*", r"\*") + "*", ""]
    if report.charts:
        out += ["## Charts", ""]
        for c in report.charts:
            out += [f"![{_md_title(c.title)}]({c.path.name})", ""]
            if c.caption:  # its own * marks are literal there, not emphasis
                out += ["*" + _md(c.caption).replace("*", r"\*") + "*", ""]
    out += _md_sections(report.sections)
    return "\n".join(out).rstrip() + "\n"


def _md_sections(sections: list[Section]) -> list[str]:
    out = []
    for section in sections:
        out += [f"## {_md(section.title)}", ""]
        if section.intro:
            out += [_md_text(_md(section.intro)), ""]
        for table in section.tables:
            out += [f"### {_md(table.title)}", "", _grid(table, "pipe", _md)]
            out += [""] + [f"*{_md_text(_md(note))}*  " for note in table.notes] + [""]
    return out


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto;
       max-width: 72rem; padding: 0 1rem; color: #1f2328; line-height: 1.45; }
h1 { border-bottom: 2px solid #d0d7de; padding-bottom: .3rem; }
h2 { margin-top: 2.2rem; border-bottom: 1px solid #d0d7de; padding-bottom: .2rem; }
h3 { font-size: 1rem; margin-bottom: .4rem; }
ul.meta { color: #57606a; }
/* a table wider than the page scrolls inside its own box, never past the page */
table { border-collapse: collapse; margin: .3rem 0 .4rem; font-size: .92rem; display: block;
        max-width: 100%; overflow-x: auto; }
th, td { border: 1px solid #d0d7de; padding: .3rem .7rem; }
th { background: #f6f8fa; text-align: left; }  /* figures: tabulate sets text-align: right */
td { white-space: nowrap; font-variant-numeric: tabular-nums; }
td:first-child { font-weight: 600; }
tr:nth-child(even) td { background: #fafbfc; }
p.note { color: #57606a; font-size: .85rem; margin: .1rem 0; }
figure { display: inline-block; margin: .5rem 1rem .5rem 0; }
figure img { max-width: 100%; border: 1px solid #d0d7de; }
figcaption { color: #57606a; font-size: .85rem; }
.answer-block { margin: 1rem 0 1.4rem; }
p.verdict { font-weight: 600; margin: .2rem 0; }
tr.best td { background: #dafbe1; }
table.missing td { white-space: normal; }
td code { white-space: pre-wrap; overflow-wrap: anywhere; }  /* a long command wraps */
figure { max-width: 100%; }
"""


def _html_text(value: str) -> str:
    """Escaped prose, with its reST-style inline code (two backticks) set as <code>."""
    return _CODE.sub(r"<code>\1</code>", html.escape(value))


def _html_table(table: Table) -> str:
    notes = "".join(f'<p class="note">{_html_text(n)}</p>' for n in table.notes)
    return f"<h3>{html.escape(table.title)}</h3>\n{_grid(table, 'html')}\n{notes}\n"


def html_page(report: Report) -> str:
    """One self-contained page: styles inline, charts embedded as base64 PNGs."""
    esc = html.escape
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
             f"<title>{esc(report.title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{esc(report.title)}</h1>",
             '<ul class="meta">' + "".join(f"<li>{esc(m)}</li>" for m in report.meta) + "</ul>"]
    if report.lead_html:
        parts.append(report.lead_html)
    else:
        for section in report.lead:
            parts.append(f"<h2>{esc(section.title)}</h2>")
            parts += [_html_table(t) for t in section.tables]
    if report.charts:
        parts.append("<h2>Charts</h2>")
        for chart in report.charts:
            data = base64.b64encode(chart.path.read_bytes()).decode("ascii")
            parts.append(f'<figure><img alt="{esc(chart.title)}" '
                         f'src="data:image/png;base64,{data}"><figcaption>{esc(chart.title)}'
                         + (f"<br>{esc(chart.caption)}" if chart.caption else "")
                         + "</figcaption></figure>")
    for section in report.sections:
        parts.append(f"<h2>{esc(section.title)}</h2>")
        if section.intro:
            parts.append(f"<p>{_html_text(section.intro)}</p>")
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


REDIRECT = ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta http-equiv="refresh" content="0; url=index.html"><title>moved</title></head>'
            '<body><p>The report page is now <a href="index.html">index.html</a>.</p></body></html>\n')


def write(report: Report, runs: pd.DataFrame, out: Path, formats: list[str]) -> list[Path]:
    """Write ``report.<format>`` for each format under ``out``; returns the files written."""
    written = []
    for fmt in formats:
        path = out / ("index.html" if fmt == "html" else f"report.{fmt}")
        if fmt == "html":  # the page moved to index.html; old links to report.html follow it
            (out / "report.html").write_text(REDIRECT, encoding="utf-8")
            written.append(out / "report.html")
        if fmt == "md":
            path.write_text(markdown(report), encoding="utf-8")
        elif fmt == "html":
            path.write_text(html_page(report), encoding="utf-8")
        elif fmt == "csv":
            csv_frame(runs).to_csv(path, index=False)
        written.append(path)
    return written
