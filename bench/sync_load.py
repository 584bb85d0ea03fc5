"""Load-and-fault benchmark of the tracking path (issue 25, item 7).

N spooled results (one sweep parent, N-1 children, each with the four usual artifacts) are
delivered by K concurrent ``fxtrack sync`` processes to a basic-auth ``mlflow server
--serve-artifacts`` backed by PostgreSQL 15, on 127.0.0.1, and the server is restarted once
mid-way (when half the results have left the spool). Every request the syncs send to the server
is counted by wrapping their HTTP session (and the /health probe). Prints N, syncs, restarts,
wall time, results/s, requests per result (in all and per endpoint), duplicates, missing, left
RUNNING, parent links, and the artifact folders that deleted runs left on the server's disk.

    python bench/sync_load.py [--results 300] [--syncs 6] [--restarts 1] [--workers 2]
                              [--auth-cache-ttl 60] [--json FILE]

``--auth-cache-ttl`` sets the server's ``auth_cache_ttl_seconds`` (basic-auth's credential
cache; 0, MLflow's default, checks the password hash on every request). Needs PostgreSQL's
initdb on PATH (``.ci/postgres.sh`` installs it); ``--sqlite`` uses an sqlite backend instead.
Target: >= 1 result/s on a 2-core machine. The records carry no dataset input (a real job's
costs one more request, ``runs/log-inputs``). Figures: docs/team-server.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from servers import ADMIN, MlflowServer, Postgres  # noqa: E402

# Runs `fxtrack sync` through the real CLI, counting every HTTP request it sends to the server
# (MLflow's own telemetry request goes elsewhere).
_COUNTING_SYNC = """
import atexit, collections, json, os, sys, urllib.request
from urllib.parse import urlsplit
import requests
sent = collections.Counter()
real_request, real_urlopen = requests.Session.request, urllib.request.urlopen
def endpoint(method, url):
    path = urlsplit(url if isinstance(url, str) else url.full_url).path
    head, sep, _ = path.partition("/mlflow-artifacts/artifacts/")
    return f"{method} {head + sep + '*' if sep else path}"  # one row for every artifact file
server = os.environ["MLFLOW_TRACKING_URI"]
def count(method, url):
    if (url if isinstance(url, str) else url.full_url).startswith(server):  # not telemetry
        sent[endpoint(method, url)] += 1
def request(self, method, url, *a, **kw):
    count(method, url)
    return real_request(self, method, url, *a, **kw)
def urlopen(url, *a, **kw):
    count("GET", url)
    return real_urlopen(url, *a, **kw)
requests.Session.request, urllib.request.urlopen = request, urlopen
atexit.register(lambda: open(os.environ["FXTRACK_BENCH_COUNTS"], "a").write(json.dumps(sent) + "\\n"))
sys.argv = ["fxtrack", "sync"]
from fxtrack.cli import main
main()
"""

EXPERIMENT = "fxtrack-sync-load"


def spool_results(home: Path, uri: str, n: int) -> tuple[str, list[str]]:
    """A finished sweep parent and n-1 children shaped like real job records."""
    os.environ["FXTRACK_HOME"] = str(home)
    from fxtrack.tracking import records, spool

    now = int(time.time() * 1000)
    parent = records.parent_record(uuid.uuid4().hex, uri, EXPERIMENT, "sweep-load",
                                   {"fxtrack.sweep": "seed=range(n)"}, "FINISHED")
    spool.write(parent, {})
    ids = [parent["result_id"]]
    tags = records.run_tags({f"fxtrack.{k}": "x" for k in ("framework", "model", "scenario",
                                                          "precision", "hardware", "devices")})
    for i in range(n - 1):
        steps = [10.0 + (i + j) % 5 for j in range(20)]
        series = {"step_time_ms": steps, "loss": [2.0 - j / 20 for j in range(20)]}
        rec = {"kind": "job", "result_id": uuid.uuid4().hex, "uri": uri, "experiment": EXPERIMENT,
               "experiment_id": None, "adopt_run_id": None, "run_name": f"torch-vit-train-{i}",
               "parent_result_id": parent["result_id"], "start_time_ms": now - 60_000,
               "end_time_ms": now, "status": "FINISHED",
               "params": {f"model.p{k}": k for k in range(40)} | {"seed": i},
               "tags": tags, "metrics": {f"m{k}": float(k) for k in range(30)},
               "series": series, "series_times_ms": records.series_times(series, now)}
        spool.write(rec, {"config.yaml": f"seed: {i}\n" * 20, "result.json": json.dumps(rec)[:2000],
                          "environment.json": "{}", "worker.log": "step\n" * 50})
        ids.append(rec["result_id"])
    return parent["result_id"], ids


def waiting(home: Path) -> int:
    spool_dir = home / "spool"
    return sum(1 for p in spool_dir.iterdir() if p.name != "bad") if spool_dir.is_dir() else 0


def run(results: int = 300, syncs: int = 6, restarts: int = 1, sqlite: bool = False,
        workers: int = 2, wait_s: float | None = None, auth_cache_ttl_s: int = 0) -> dict:
    root = Path(tempfile.mkdtemp(prefix="fxtrack-sync-load-"))
    pg = None if sqlite else Postgres().start()
    server = MlflowServer(root / "server", auth=True, postgres=pg, workers=workers,
                          auth_cache_ttl_s=auth_cache_ttl_s)
    try:
        server.start(wait_s=600)
        home = root / "home"
        parent_id, ids = spool_results(home, server.url, results)
        counts = root / "counts.txt"
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env.update(FXTRACK_HOME=str(home), MLFLOW_TRACKING_URI=server.url,
                   MLFLOW_TRACKING_USERNAME=ADMIN[0], MLFLOW_TRACKING_PASSWORD=ADMIN[1],
                   FXTRACK_BENCH_COUNTS=str(counts),
                   PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p))
        if wait_s is not None:
            env["FXTRACK_SYNC_WAIT_S"] = str(wait_s)
        done_restarts: list[float] = []

        def chaos():
            """Restart the server each time another 1/(restarts+1) of the results has left."""
            for k in range(1, restarts + 1):
                while waiting(home) > results * (1 - k / (restarts + 1)):
                    if all(p.poll() is not None for p in procs):
                        return
                    time.sleep(0.2)
                down = time.monotonic()
                server.stop()
                server.start(wait_s=600)
                done_restarts.append(time.monotonic() - down)

        started = time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-c", _COUNTING_SYNC], env=env, cwd=root,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for _ in range(syncs)]
        controller = threading.Thread(target=chaos, daemon=True)
        controller.start()
        outputs = [p.communicate()[0] for p in procs]
        wall = time.monotonic() - started
        controller.join(timeout=600)
        figures = _audit(server, parent_id, ids)
        by_endpoint: Counter[str] = Counter()
        for line in (counts.read_text().splitlines() if counts.exists() else []):
            by_endpoint.update(json.loads(line))
        sent = sum(by_endpoint.values())
        figures.update(
            results=results, syncs=syncs, restarts=len(done_restarts), workers=workers,
            auth_cache_ttl_s=auth_cache_ttl_s,
            restart_down_s=[round(d, 1) for d in done_restarts], wall_s=round(wall, 1),
            results_per_s=round(results / wall, 3), requests=sent,
            requests_per_result=round(sent / results, 2),
            per_result_by_endpoint={k: round(v / results, 2)
                                    for k, v in by_endpoint.most_common()},
            sync_exit_codes=[p.returncode for p in procs], left_in_spool=waiting(home),
            tracebacks=sum("Traceback" in o for o in outputs),
            cpus=os.cpu_count(), load_avg_1m=round(os.getloadavg()[0], 2))
        (root / "sync-outputs.txt").write_text("\n=====\n".join(outputs))
        return figures
    finally:
        server.stop()
        if pg is not None:
            pg.stop()
        shutil.rmtree(root, ignore_errors=True)


def _audit(server: MlflowServer, parent_id: str, ids: list[str]) -> dict:
    """What landed: duplicates, missing, left RUNNING, parent links, deleted runs' folders."""
    import mlflow
    from mlflow.entities import ViewType

    os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = ADMIN
    client = mlflow.MlflowClient(server.url)
    exp = client.get_experiment_by_name(EXPERIMENT)
    runs, deleted = [], []
    for view, into in ((ViewType.ACTIVE_ONLY, runs), (ViewType.DELETED_ONLY, deleted)):
        token = None
        while exp is not None:
            page = client.search_runs([exp.experiment_id], run_view_type=view, max_results=1000,
                                      page_token=token)
            into.extend(page)
            token = page.token
            if not token:
                break
    by_id: dict[str, list] = {}
    for r in runs:
        by_id.setdefault(r.data.tags.get("fxtrack.result_id", ""), []).append(r)
    parent = by_id.get(parent_id, [None])[0]
    children = [r for r in runs if r.data.tags.get("fxtrack.result_id") != parent_id]
    folders = server.root / "artifacts"
    leftovers = sum(1 for r in deleted if exp is not None and any(
        (folders / exp.experiment_id / r.info.run_id).rglob("*.*")))
    return {"landed": len(by_id), "duplicates": len(runs) - len(by_id),
            "missing": len(set(ids) - set(by_id)),
            "left_running": sum(r.info.status == "RUNNING" for r in runs),
            "parent_links": sum(parent is not None and
                                r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
                                for r in children),
            "children": len(ids) - 1, "deleted_runs": len(deleted),
            "deleted_runs_with_artifacts_left": leftovers}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=int, default=300)
    parser.add_argument("--syncs", type=int, default=6)
    parser.add_argument("--restarts", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2, help="mlflow server workers")
    parser.add_argument("--auth-cache-ttl", type=int, default=0, metavar="S",
                        help="the server's auth_cache_ttl_seconds (0: MLflow's default, off)")
    parser.add_argument("--sqlite", action="store_true", help="sqlite backend, no PostgreSQL")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if not args.sqlite and shutil.which("initdb") is None:
        print("sync_load: initdb is not on PATH: run .ci/postgres.sh first (or --sqlite)",
              file=sys.stderr)
        return 2
    figures = run(args.results, args.syncs, args.restarts, args.sqlite, args.workers,
                  auth_cache_ttl_s=args.auth_cache_ttl)
    for key, value in figures.items():
        print(f"{key:>34}: {value}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    ok = figures["duplicates"] == figures["missing"] == figures["left_running"] == 0 and \
        figures["parent_links"] == figures["children"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
