"""Regenerate the README's two images from a real tiny sweep on this machine:

    python docs/make_images.py              # needs Debian's chromium (apt-get install chromium)
    python docs/make_images.py --repeats 5  # more repeats, narrower intervals

1. a tiny sweep of every installed framework x resnet50/bert/vit, each config ``--repeats`` times
   (default 3, round-robin), into a temporary MLflow store; each job first waits up to 30 s for
   the machine to go quiet (hardware.wait_for_idle_s). Run it on a quiet machine: contended runs
   are tagged and marked in the report, and the script says how many there were;
2. ``fxtrack report`` on it -> docs/report-throughput.png (medians with 95% interval error bars)
   and docs/report-verdicts.txt (the report's terminal output: throughput and verdict tables);
3. ``mlflow ui`` on that store, photographed by headless Chromium -> docs/mlflow-ui.png (the
   compare view of the configs' aggregate runs), and through docs/mlflow_ui_shots.py a run's
   page -> docs/mlflow-ui-run.png and its System metrics tab -> docs/mlflow-ui-system-metrics.png
   (shown in docs/mlflow-ui.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from urllib.parse import quote
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--window-size=1900,1000", "--virtual-time-budget=25000"]


def run(*cmd: str, cwd: Path, env: dict) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=cwd, env=env, check=True)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("needs Debian's chromium: apt-get install chromium")
    frameworks = [fw for fw in ("torch", "tensorflow", "jax") if importlib.util.find_spec(fw)]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env["FXTRACK_HOME"] = str(work / "home")
        run(sys.executable, "-m", "fxtrack", "-m", f"framework={','.join(frameworks)}",
            "model=resnet50,bert,vit", "size=tiny", "batch_size=2", "steps=5", "warmup_steps=2",
            f"repeats={args.repeats}", "hardware.wait_for_idle_s=30", cwd=work, env=env)
        print("+ fxtrack report", flush=True)
        report = subprocess.run([sys.executable, "-m", "fxtrack", "report", "--out",
                                 str(work / "report"), "--no-log"], cwd=work, env=env, check=True,
                                capture_output=True, text=True)
        (DOCS / "report-verdicts.txt").write_text(report.stdout)
        print(report.stdout)
        chart = sorted((work / "report").glob("*throughput*.png"))[0]
        shutil.copyfile(chart, DOCS / "report-throughput.png")

        sys.path.insert(0, str(DOCS))
        import mlflow_ui_shots

        with mlflow_ui_shots.mlflow_ui(f"sqlite:///{work / 'mlflow.db'}", work) as base:
            import mlflow

            client = mlflow.MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
            exp = client.get_experiment_by_name("fxtrack").experiment_id
            # MLflow's compare view of the sweep's configs: their aggregate runs (median and
            # interval of the repeats), not the repeats or the sweep's parent.
            runs = client.search_runs([exp])
            ids = [r.info.run_id for r in runs if r.data.tags.get("fxtrack.kind") == "aggregate"]
            busy = sum(r.data.tags.get("fxtrack.contended") == "true" for r in runs
                       if "fxtrack.repeat" in r.data.tags)
            print(f"{len(ids)} configs x {args.repeats} repeats; {busy} repeats were contended")
            url = (f"{base}/#/compare-runs?runs={quote(json.dumps(ids))}"
                   f"&experiments={quote(json.dumps([exp]))}&workflowType=machine_learning")
            run(chromium, *CHROMIUM_FLAGS, f"--user-data-dir={work / 'chromium'}",
                f"--screenshot={DOCS / 'mlflow-ui.png'}", url, cwd=work, env=env)
        mlflow_ui_shots.photograph(f"sqlite:///{work / 'mlflow.db'}", DOCS, cwd=work)
    print(f"wrote {DOCS / 'report-throughput.png'}, {DOCS / 'report-verdicts.txt'}, "
          f"{DOCS / 'mlflow-ui.png'} and {DOCS}/mlflow-ui-{{run,system-metrics}}.png")


if __name__ == "__main__":
    main()
