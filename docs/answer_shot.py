"""Photograph the report's page (fxtrack-report/index.html) with headless Chromium, offline and in
a fresh profile, for docs/reading-the-answer.md:

    python docs/answer_shot.py --page fxtrack-report/index.html --out docs/answer-page.png
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlflow_ui_shots import blank, chromium  # noqa: E402


def shoot(page: Path, png: Path, height: int = 2400) -> Path:
    profile = Path(tempfile.mkdtemp(prefix="answer-shot-"))
    try:
        chromium(f"--window-size=1400,{height}", f"--screenshot={png}", page.resolve().as_uri(),
                 profile=profile)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if blank(png):
        raise RuntimeError(f"{png} came out blank")
    return png


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--page", type=Path, default=Path("fxtrack-report/index.html"))
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "answer-page.png")
    args = parser.parse_args()
    print(shoot(args.page, args.out))
