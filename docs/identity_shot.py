"""Photograph the report page of issue 42's store with headless Chromium, for
docs/reading-the-answer.md: the store tests/test_identity.py builds (a full ViT-B/16 run, tiny
runs, three separate JAX runs with equal params, a repeats=3 TensorFlow sweep, a fit and two
serve loads), reported by ``fxtrack report`` on the current tree:

    python docs/identity_shot.py --out docs/identity-page.png
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "docs"), str(ROOT / "tests"), str(ROOT)]
from answer_shot import shoot  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "identity-page.png")
    parser.add_argument("--height", type=int, default=3000)
    args = parser.parse_args()
    import test_identity

    from fxtrack.report.cli import main as report

    work = Path(tempfile.mkdtemp(prefix="identity-shot-"))
    uri = f"sqlite:///{work / 'mlflow.db'}"
    test_identity.build(uri)
    if report(["--uri", uri, "--out", str(work / "fxtrack-report"), "--no-log"]) != 0:
        return 1
    print(shoot(work / "fxtrack-report" / "index.html", args.out, args.height))
    return 0


if __name__ == "__main__":
    sys.exit(main())
