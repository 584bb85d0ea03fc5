"""Photograph the report page of a generated store (issue 58) with headless Chromium, for
docs/reading-the-answer.md: the first afternoon tests/test_figures.py generates from a seed
(train runs single and in repeat groups, contended and noisy runs, serve searches with both
policies and their caveats, converge on MNIST and on two user files to two targets), reported
by ``fxtrack report`` on the current tree:

    python docs/figures_shot.py --seed 3 --out docs/figures-page.png

``overflow(page)`` is the layout check the tests run: the page's elements that reach past a
1000-pixel-wide window, as the browser lays them out.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "docs"), str(ROOT / "tests"), str(ROOT)]
from answer_shot import shoot  # noqa: E402
from mlflow_ui_shots import chromium  # noqa: E402

# the page's elements whose right edge lies past the window (a table, a chart, a long command)
_PROBE = """<script>
window.addEventListener('load', () => {
  const past = [...document.querySelectorAll('body *')].filter(
    e => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1
         && !e.closest('table, pre'))  /* inside a scrolling table: its own box scrolls */
    .map(e => e.tagName + (e.className ? '.' + e.className : ''));
  const tables = [...document.querySelectorAll('table')].filter(
    t => t.getBoundingClientRect().right > document.documentElement.clientWidth + 1).length;
  document.body.setAttribute('data-past', JSON.stringify({past, tables}));
});
</script>"""


def overflow(page: Path, width: int = 1000) -> dict:
    """{"past": [elements past the window], "tables": how many tables reach past it}."""
    import json
    import re

    probe = page.with_name("layout-probe.html")
    probe.write_text(page.read_text().replace("</body>", _PROBE + "</body>"))
    profile = Path(tempfile.mkdtemp(prefix="layout-"))
    try:
        dom = chromium(f"--window-size={width},900", "--virtual-time-budget=5000",
                       "--dump-dom", probe.resolve().as_uri(), profile=profile)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
        probe.unlink()
    found = re.search(r'data-past="([^"]*)"', dom)
    if not found:
        raise RuntimeError("the page's layout probe did not run")
    return json.loads(found.group(1).replace("&quot;", '"'))


def report_page(seed: int, work: Path) -> Path:
    """The generated store of ``seed`` in an MLflow store under ``work``, and its report page."""
    import test_figures

    from fxtrack.report.cli import main as report

    uri = f"sqlite:///{work / 'mlflow.db'}"
    test_figures.log(test_figures.generate(seed).runs, uri)
    if report(["--uri", uri, "--out", str(work / "fxtrack-report"), "--no-log"]) != 0:
        raise RuntimeError("fxtrack report failed")
    return work / "fxtrack-report" / "index.html"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures-page.png")
    parser.add_argument("--height", type=int, default=3400)
    args = parser.parse_args()
    page = report_page(args.seed, Path(tempfile.mkdtemp(prefix="figures-shot-")))
    print("layout:", overflow(page))
    print(shoot(page, args.out, args.height))
    return 0


if __name__ == "__main__":
    sys.exit(main())
