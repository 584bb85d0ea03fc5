"""Photograph one fxtrack run's pages in the MLflow UI with headless Chromium:

    python docs/mlflow_ui_shots.py --store sqlite:///path/to/mlflow.db   # -> docs/mlflow-ui-*.png

Starts ``mlflow ui`` on 127.0.0.1 over the store, opens a finished benchmark run (a job run:
``fxtrack.framework`` set, not an aggregate or a sweep's parent) and, for its Overview and
System metrics tab, saves a screenshot and Chromium's DOM dump (the page as
rendered, scripts run). docs/make_images.py calls it after its sweep; tests/test_system_metrics.py
calls ``photograph`` over a tiny run and checks what the pages show.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional, Sequence

from fxtrack.tracking.ui import run_link, ui_env, wait_until_up

DOCS = Path(__file__).resolve().parent
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--window-size=1900,1000"]
VIRTUAL_MS = 20000  # how long (virtual time) Chromium lets the page run before it shoots
# page name -> the run page's route suffix (MLflow 3's run-page tabs). Not the Model metrics
# tab: headless Chromium shoots its dozens of charts as spinners (they draw as they scroll into
# view), even with a minute of virtual time.
PAGES = {"run": "", "system-metrics": "/system-metrics"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_ui(store_uri: str, cwd: Path, timeout_s: float = 120) -> Iterator[str]:
    """``mlflow ui`` over ``store_uri`` on a free loopback port; yields its base URL."""
    port = free_port()
    ui = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "ui",
                           "--backend-store-uri", store_uri, "--host", "127.0.0.1",
                           "--port", str(port)], cwd=cwd, env=ui_env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        if not wait_until_up(base, ui, timeout_s):
            raise RuntimeError(f"mlflow ui did not answer on {base}")
        yield base
    finally:
        os.killpg(ui.pid, 15)  # its session: the server and its workers
        ui.wait(timeout=30)


def chromium(*args: str, profile: Path, timeout_s: float = 180) -> str:
    exe = shutil.which("chromium")
    if exe is None:
        raise RuntimeError("needs Debian's chromium on PATH (apt-get install chromium)")
    proc = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


def blank(png: Path) -> bool:
    """True when the screenshot is missing or all but empty: fewer than 1% of its pixels differ
    from the most common colour (a white page, or a spinner on one)."""
    from PIL import Image

    if not png.is_file():
        return True
    with Image.open(png) as im:
        pixels = im.convert("RGB").getcolors(maxcolors=1 << 24)
        total = im.width * im.height
    return max(n for n, _ in pixels) > 0.99 * total


def benchmark_run(store_uri: str) -> tuple[str, str, str]:
    """(experiment id, run id, run name) of the first finished job run in ``fxtrack``."""
    import mlflow

    client = mlflow.MlflowClient(store_uri)
    exp = client.get_experiment_by_name("fxtrack")
    if exp is None:
        raise RuntimeError(f"{store_uri} has no fxtrack experiment")
    for run in client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"]):
        tags = run.data.tags
        if (tags.get("fxtrack.framework") and run.info.status == "FINISHED"
                and tags.get("fxtrack.kind") not in ("aggregate", "report")):
            return exp.experiment_id, run.info.run_id, run.info.run_name
    raise RuntimeError(f"{store_uri} has no finished benchmark run")


def photograph(store_uri: str, out: Path, cwd: Optional[Path] = None,
               prefix: str = "mlflow-ui-", pages: Sequence[str] = tuple(PAGES),
               expect: Optional[dict] = None, tries: int = 4) -> dict:
    """Screenshots and DOM dumps of a benchmark run's ``pages`` (of PAGES) under ``out``:
    returns {"run_name": ..., page: (png path, dom text), ...}. ``expect`` (page -> strings): a
    page whose DOM lacks one is shot again, up to ``tries`` times, its virtual time doubled each
    time: on a loaded machine the UI's requests to the server take real time that Chromium's
    virtual-time budget does not wait for (three tries of 20 s missed the System metrics charts
    once in the full suite, 2026-12-05)."""
    exp, run_id, name = benchmark_run(store_uri)
    out.mkdir(parents=True, exist_ok=True)
    shots: dict = {"run_name": name}
    work = Path(cwd or out)
    with mlflow_ui(store_uri, work) as base:
        for page in pages:
            url = run_link(base, exp, run_id).replace("?", f"{PAGES[page]}?", 1)
            png = out / f"{prefix}{page}.png"
            profile = work / f"chromium-{page}"
            for attempt in range(tries):  # each try with twice the last one's virtual time
                budget = f"--virtual-time-budget={VIRTUAL_MS * 2**attempt}"
                chromium(budget, f"--screenshot={png}", url, profile=profile)
                dom = chromium(budget, "--dump-dom", url, profile=profile)
                if all(text in dom for text in (expect or {}).get(page, ())):
                    break
            shutil.rmtree(profile, ignore_errors=True)
            shots[page] = (png, dom)
    return shots


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="the MLflow store URI, e.g. sqlite:///mlflow.db")
    parser.add_argument("--out", type=Path, default=DOCS)
    args = parser.parse_args()
    shots = photograph(args.store, args.out)
    for page in PAGES:
        png, _ = shots[page]
        print(f"wrote {png}" + (" (BLANK)" if blank(png) else ""))


if __name__ == "__main__":
    main()
