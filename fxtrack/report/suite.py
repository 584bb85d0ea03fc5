"""Across the suite (issue 62): one verdict per objective over every cell the page holds.

A cell is one block of the answer (a model at the dims that ran, a machine, an experiment), its
figures from the one figure function (``samples.sample``). For each objective where two or more
frameworks have figures on two or more cells, AlgoPerf's performance profile: each framework's
ratio to the cell's best (>= 1, oriented so that 1 is the best whichever way the metric
improves), and the share of cells where that ratio is within tau, for tau from 1 to 4; a
framework without a figure in a cell is scored at the cap (past tau = 4) and the cell named.
Beside it, each framework's geometric mean of those ratios (weighted by the cells' weights), with
a 95% interval that carries each cell's uncertainty: a bootstrap that redraws each figure's mean
log from its repeats (Student t, the figure's own log mean, sd and n), recomputes every ratio
and the geometric mean. A single run carries no uncertainty of its own: its cell is fixed.

``fxtrack report --suite FILE`` names a team's own mix: a YAML list of cells, each
``{objective: train, model: "vit tiny", weight: 2}`` (``model`` matches the block's model as its
dims name it, or the family's name; an omitted key matches every cell), the rest left out.
"""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path
from typing import Any, Optional

CAP = 4.0  # AlgoPerf's largest tau: a framework past it (or missing) is not within the profile
TAUS = (1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0)  # the profile's columns
DRAWS = 2000  # bootstrap resamples
SEED = 58  # the bootstrap's generator: the same store gives the same interval


@dataclasses.dataclass
class Cell:
    objective: str  # the objective's key (train, serve, quality, ...)
    name: str  # "vit tiny (cpu, fp32, x1, batch 2, data=mnist)"
    model: str  # the family
    label: str  # the model as its dims name it
    weight: float
    figures: dict[str, Any]  # framework -> samples.Sample
    lower: bool  # lower is better


@dataclasses.dataclass
class Standing:
    framework: str
    cells: int  # cells with a figure
    geomean: float  # geometric mean ratio to the best (1 = best everywhere)
    interval: Optional[tuple[float, float]]
    profile: dict[float, float]  # tau -> share of the weight within it
    missing: list[str]  # the cells without a figure, by name


@dataclasses.dataclass
class Suite:
    objective: str
    title: str
    cells: list[Cell]
    standings: list[Standing]  # best geometric mean first


def cells(blocks: list, weights: Optional[list[dict]] = None) -> list[Cell]:
    """The answer's blocks as cells, each framework's figure from its entry; ``weights`` (the
    --suite file's list) keeps only the cells it names, with their weights."""
    out = []
    for b in blocks:
        name = (f"{b.label or b.model} ({b.machine}, batch {b.batch}"
                + (f", {b.where}" if b.where else "") + ")")
        weight = 1.0
        if weights is not None:
            chosen = [w for w in weights if _matches(w, b)]
            if not chosen:
                continue
            weight = float(chosen[0].get("weight", 1.0))
        figures = {e.framework: e.sample for e in b.entries
                   if e.sample.point and not math.isnan(e.sample.point)}
        out.append(Cell(b.objective.key, name, b.model, b.label, weight, figures, b.objective.lower))
    return out


def _matches(want: dict, block: Any) -> bool:
    if "objective" in want and want["objective"] != block.objective.key:
        return False
    return "model" not in want or want["model"] in (block.label, block.model)


def ratio(figure: float, best: float, lower: bool) -> float:
    """The performance ratio, >= 1: how far from the cell's best."""
    return figure / best if lower else best / figure


def profile(ratios: list[tuple[float, float]], taus=TAUS) -> dict[float, float]:
    """tau -> the weight share of (ratio, weight) pairs within tau (None ratio: missing)."""
    total = sum(w for _, w in ratios) or 1.0
    return {t: sum(w for r, w in ratios if r is not None and r <= t) / total for t in taus}


def geomean(ratios: list[tuple[Optional[float], float]]) -> float:
    """The weighted geometric mean of the ratios, a missing one (None) at the cap."""
    total = sum(w for _, w in ratios) or 1.0
    return math.exp(sum(w * math.log(CAP if r is None else min(r, CAP)) for r, w in ratios) / total)


def standings(found: list[Cell]) -> list[Standing]:
    frameworks = sorted({fw for c in found for fw in c.figures})
    rng = random.Random(SEED)
    point = _ratios(found, {fw: {c.name: s.point for c, s in _each(found, fw)} for fw in frameworks})
    draws: dict[str, list[float]] = {fw: [] for fw in frameworks}
    uncertain = any(s.log for c in found for s in c.figures.values())
    for _ in range(DRAWS if uncertain else 0):
        drawn = {fw: {c.name: _draw(s, rng) for c, s in _each(found, fw)} for fw in frameworks}
        for fw, pairs in _ratios(found, drawn).items():
            draws[fw].append(geomean(pairs))
    out = []
    for fw in frameworks:
        pairs = point[fw]
        interval = None
        if draws[fw]:
            ranked = sorted(draws[fw])
            interval = (ranked[int(0.025 * len(ranked))], ranked[int(0.975 * len(ranked)) - 1])
        out.append(Standing(fw, sum(r is not None for r, _ in pairs), geomean(pairs), interval,
                            profile(pairs), [c.name for c in found if fw not in c.figures]))
    return sorted(out, key=lambda s: s.geomean)


def _each(found: list[Cell], fw: str):
    return [(c, c.figures[fw]) for c in found if fw in c.figures]


def _ratios(found: list[Cell], values: dict[str, dict[str, float]]
            ) -> dict[str, list[tuple[Optional[float], float]]]:
    """framework -> [(its ratio to the cell's best, the cell's weight)] over every cell."""
    out: dict[str, list] = {fw: [] for fw in values}
    for c in found:
        here = {fw: v[c.name] for fw, v in values.items() if c.name in v}
        best = (min if c.lower else max)(here.values())
        for fw in values:
            out[fw].append((ratio(here[fw], best, c.lower) if fw in here else None, c.weight))
    return out


def _draw(sample: Any, rng: random.Random) -> float:
    """One bootstrap draw of a figure: its mean log redrawn from the t distribution of its
    repeats (mean, sd, n); a figure without repeats as it is."""
    if not sample.log:
        return sample.point
    mean, sd, n = sample.log
    # Student t with n-1 degrees of freedom, from normals and a chi-square
    z = rng.gauss(0.0, 1.0)
    chi = sum(rng.gauss(0.0, 1.0) ** 2 for _ in range(n - 1))
    t = z / math.sqrt(chi / (n - 1)) if n > 1 and chi > 0 else z
    return sample.point * math.exp(t * sd / math.sqrt(n))


def suites(blocks: list, weights: Optional[list[dict]] = None) -> list[Suite]:
    """One Suite per objective where 2+ frameworks have figures on 2+ cells."""
    found = cells(blocks, weights)
    out = []
    for key in dict.fromkeys(c.objective for c in found):
        mine = [c for c in found if c.objective == key]
        counts: dict[str, int] = {}
        for c in mine:
            for fw in c.figures:
                counts[fw] = counts.get(fw, 0) + 1
        if len([fw for fw, n in counts.items() if n >= 2]) < 2 or len(mine) < 2:
            continue
        title = next(b.objective.title for b in blocks if b.objective.key == key)
        out.append(Suite(key, title, mine, standings(mine)))
    return out


def read_weights(path: Path) -> list[dict]:
    """The --suite file: a YAML list of cells ({objective, model, weight}); ValueError naming
    what is wrong, before any work."""
    import yaml

    try:
        found = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"--suite {path}: cannot read it ({e})") from None
    if not isinstance(found, list) or not all(isinstance(c, dict) for c in found):
        raise ValueError(f"--suite {path}: a YAML list of cells, each "
                         "{objective: ..., model: ..., weight: ...}")
    for c in found:
        bad = set(c) - {"objective", "model", "weight"}
        if bad:
            raise ValueError(f"--suite {path}: unknown key {sorted(bad)[0]!r} in {c}; a cell "
                             "takes objective, model, weight")
        weight = c.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not \
                math.isfinite(weight) or weight <= 0:
            raise ValueError(f"--suite {path}: weight must be a positive number, got {weight!r}")
    return found


def table(suite: Suite):
    """The suite as a report table: one row per framework, the best geometric mean first."""
    from fxtrack.report.answer import fw_words
    from fxtrack.report.tables import Table

    rows = []
    for s in suite.standings:
        interval = "" if s.interval is None else f" [{s.interval[0]:.2f}, {s.interval[1]:.2f}]"
        rows.append([fw_words(s.framework), f"{s.cells}/{len(suite.cells)}",
                     f"{s.geomean:.2f}x{interval}",
                     *(f"{s.profile[t]:.0%}" for t in TAUS),
                     "; ".join(s.missing) or "-"])
    best = suite.standings[0]
    words = (f"Across {len(suite.cells)} cells of {suite.title.lower()}, "
             f"{fw_words(best.framework)} is nearest the best: a geometric mean "
             f"{best.geomean:.2f}x the cell's best"
             + ("" if best.interval is None else
                f" [{best.interval[0]:.2f}, {best.interval[1]:.2f}]")
             + "; " + "; ".join(f"{fw_words(s.framework)} {s.geomean:.2f}x"
                                + ("" if s.interval is None
                                   else f" [{s.interval[0]:.2f}, {s.interval[1]:.2f}]")
                                for s in suite.standings[1:])
             + ". A missing cell counts at the cap (4x).")
    return Table(f"Across the suite: {suite.title} ({len(suite.cells)} cells: "
                 + "; ".join(c.name for c in suite.cells) + ")",
                 ["framework", "cells", "geomean ratio to best [95%]",
                  *(f"within {t:g}x" for t in TAUS), "missing cells (at the cap)"], rows, [words])


def chart(suite: Suite, out: Path):
    """The performance profile: each framework's share of cells within tau of the best."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fxtrack.report.answer import fw_words
    from fxtrack.report.charts import Chart, colour

    taus = [1 + i * 0.01 for i in range(int((CAP - 1) / 0.01) + 1)]
    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    ratios = _ratios(suite.cells, {x.framework: {c.name: sm.point for c, sm in
                                                 _each(suite.cells, x.framework)}
                                   for x in suite.standings})
    for s in suite.standings:
        shares = profile(ratios[s.framework], taus)
        ax.step(taus, [shares[t] for t in taus], where="post", color=colour(s.framework),
                label=f"{fw_words(s.framework)} (geomean {s.geomean:.2f}x)")
    ax.set_xlabel("tau: within this factor of the cell's best")
    ax.set_ylabel("share of cells")
    ax.set_ylim(-0.02, 1.05)
    ax.set_title(f"Across the suite: {suite.title} ({len(suite.cells)} cells)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / f"suite_{suite.objective}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Chart(f"Across the suite: {suite.title}", path,
                 "AlgoPerf's performance profile: the share of cells where each framework is "
                 "within tau of the cell's best; a missing cell never is")

