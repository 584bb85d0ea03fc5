"""The answer blocks as text, Markdown and HTML (the page ``fxtrack-report/index.html``), each
figure linked to its MLflow run. Links carry ``workflowType=machine_learning``: the MLflow UI
otherwise opens an experiment in its GenAI layout, picked by a switch kept in the browser."""

from __future__ import annotations

import html
from typing import Optional

from fxtrack.report.answer import NO_CLEAR, RULED, SINGLE, Block, Missing, fw_words, sentence
from fxtrack.report.tables import Table
from fxtrack.tracking.ui import experiment_link, run_link

DEFAULT_UI = "http://127.0.0.1:5000"  # where `fxtrack ui` / `mlflow ui` serve by default


def ui_base(uri: str, override: Optional[str] = None) -> str:
    """The MLflow UI the links point to: ``override``, else the tracking server itself, else
    the local ``mlflow ui`` default."""
    from fxtrack.environment import redact_uri_text

    if override:  # a link's credentials would reach every reader of the page (issue 60)
        return redact_uri_text(override).rstrip("/")
    if uri.startswith(("http://", "https://")):
        return redact_uri_text(uri).rstrip("/")
    return DEFAULT_UI


def _figure(value: float) -> str:
    return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.1f}"


def table(block: Block) -> Table:
    """The block as a report table: one row per framework, best first; its sentence as a note."""
    rows = []
    for entry, r in zip(block.entries, block.ratios):
        verdict = "best" if entry is block.best else block.verdict(r)
        rows.append([fw_words(entry.framework), entry.mode, _figure(entry.sample.point),
                     str(entry.sample.n), "1.00x" if entry is block.best else r.cell(),
                     {"clear": "clear difference"}.get(verdict, verdict),
                     ", ".join(entry.sample.caveats) or "-"])
    where = f", {block.where}" if block.where else ""
    title = (f"{block.objective.title}: {block.label or block.model} ({block.machine}, "
             f"batch {block.batch}{where})")
    return Table(title, ["framework", "mode / levers", block.best.metric, "repeats",
                         "ratio to best [95%]", "verdict", "caveats"], rows, [sentence(block)])


def _plain_block(t: Table) -> str:
    """A table without run links (the suite's, code size), its sentence above it."""
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in t.header)
    rows = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in t.rows)
    return (f'<div class="answer-block"><h3>{esc(t.title)}</h3>'
            f'<p class="verdict">{esc(t.notes[0])}</p><table><tr>{head}</tr>{rows}</table></div>')


def _figure_html(chart) -> str:
    import base64

    data = base64.b64encode(chart.path.read_bytes()).decode("ascii")
    return (f'<figure class="profile"><img alt="{html.escape(chart.title)}" '
            f'src="data:image/png;base64,{data}"><figcaption>{html.escape(chart.title)}<br>'
            f"{html.escape(chart.caption)}</figcaption></figure>")


def missing_table(missing: list[Missing]) -> Optional[Table]:
    if not missing:
        return None
    rows = [[m.label or m.model, m.objective.title, m.checked()] for m in missing]
    return Table("Objectives with no runs yet: the command that measures each",
                 ["model", "objective", "command"], rows)


def html_blocks(blocks: list[Block], missing: list[Missing], base: str, experiment_id: str,
                pareto: list, extra: Optional[list[Table]] = None,
                first: Optional[list[Table]] = None, first_charts: Optional[list] = None) -> str:
    """The page's answer section: a block per objective, each figure a link to its run; then
    the Pareto charts (embedded as data URIs) and the objectives without runs."""
    import base64

    esc = html.escape
    parts = ['<section id="answer"><h2>The answer</h2>',
             f'<p class="note"><a href="{esc(experiment_link(base, experiment_id))}">'
             'the runs in MLflow</a>; each figure links to the run it stands on.</p>']
    for t, chart in zip(first or [], first_charts or [None] * len(first or [])):  # the suite
        parts.append(_plain_block(t))
        if chart is not None:
            parts.append(_figure_html(chart))
    for block in blocks:
        t = table(block)
        rows = []
        for entry, r, row in zip(block.entries, block.ratios, t.rows):
            link = run_link(base, experiment_id, entry.sample.run_ids[-1])
            cells = [esc(row[0]), esc(row[1]),
                     f'<a class="run" href="{esc(link)}">{esc(row[2])}</a>', esc(row[3]),
                     esc(row[4]), esc(row[5]), esc(row[6])]
            cls = "best" if entry is block.best else {NO_CLEAR: "tie", SINGLE: "single", RULED: "single"}.get(
                block.verdict(r), "clear")
            rows.append(f'<tr class="{cls}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        head = "".join(f"<th>{esc(h)}</th>" for h in t.header)
        parts.append(f'<div class="answer-block"><h3>{esc(t.title)}</h3>'
                     f'<p class="verdict">{esc(t.notes[0])}</p>'
                     f"<table><tr>{head}</tr>{''.join(rows)}</table></div>")
    for t in extra or []:  # figures without runs to link (code size)
        parts.append(_plain_block(t))
    for chart in pareto:
        data = base64.b64encode(chart.path.read_bytes()).decode("ascii")
        links = ", ".join(f'<a class="run" href="{esc(run_link(base, experiment_id, p.run_id))}">'
                          f"{esc(p.label)}</a>" for p in chart.points)
        parts.append(f'<figure class="pareto"><img alt="{esc(chart.title)}" '
                     f'src="data:image/png;base64,{data}"><figcaption>{esc(chart.title)}<br>'
                     f"{esc(chart.caption)}<br>points: {links}</figcaption></figure>")
    gaps = missing_table(missing)
    if gaps:
        rows = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" if i < 2 else f"<td><code>{esc(c)}</code></td>"
                                        for i, c in enumerate(row)) + "</tr>" for row in gaps.rows)
        parts.append(f'<h3>{esc(gaps.title)}</h3><table class="missing">'
                     f"<tr>{''.join(f'<th>{esc(h)}</th>' for h in gaps.header)}</tr>{rows}</table>")
    parts.append("</section>")
    return "\n".join(parts)


def code_size_table(frameworks: list[str]) -> Optional[Table]:
    """Code size: each framework's implementation in fxtrack's source, counted (the same on every
    run of a version: a count, not a measurement, so no interval), fewest lines first."""
    from fxtrack.measure.complexity import code_metrics

    fws = list(dict.fromkeys(fw.partition("-")[0] for fw in frameworks))
    sloc = {fw: code_metrics(fw).get("code_sloc") for fw in fws}
    sloc = {fw: v for fw, v in sloc.items() if v}
    if not sloc:
        return None
    ranked = sorted(sloc, key=sloc.get)
    best = sloc[ranked[0]]
    rows = [[fw_words(fw), f"{sloc[fw]:,.0f}", f"{sloc[fw] / best:.2f}x"] for fw in ranked]
    words = (f"{fw_words(ranked[0])}'s implementation is the smallest ({best:,.0f} source lines)"
             + ("; " + ", ".join(f"{fw_words(fw)} {sloc[fw] / best:.2f}x" for fw in ranked[1:])
                if len(ranked) > 1 else "") + " (counted, not measured: no interval).")
    return Table("Code size: source lines of each framework's implementation",
                 ["framework", "code_sloc", "ratio to smallest"], rows, [words])
