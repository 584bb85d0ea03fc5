"""SLURM: multi-node settings from SLURM's environment (unit tests, run everywhere), and sweeps
through the submitit launcher on a real one-node cluster (marker ``slurm``: they run where
``.ci/slurm.sh`` started one, as ``.ci/run`` does, and are skipped with the reason elsewhere).

The cluster has no accounting storage (``sacct`` cannot answer, submitit reports UNKNOWN), so jobs
are judged by ``squeue`` while they run and by their MLflow runs afterwards."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from fxtrack.cli import CONF_DIR
from fxtrack.config import register
from fxtrack.config import slurm
from fxtrack.config.validate import validate
from fxtrack.orchestrator.job import job_spec
from fxtrack.orchestrator.runner import worker_command
from conftest import fxtrack_env, seed_peak_cache

SLURM_JOB = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "4", "SLURM_NODEID": "2",
             "SLURM_JOB_NODELIST": "gpu[07-08,10],login1"}


@pytest.mark.parametrize("nodelist, hosts", [
    ("node01", ["node01"]),
    ("node[01-04],x", ["node01", "node02", "node03", "node04", "x"]),
    ("gpu[7,9-10]", ["gpu7", "gpu9", "gpu10"]),
    ("a[1-2]-b[08-09],c", ["a1-b08", "a1-b09", "a2-b08", "a2-b09", "c"]),
    ("rack1-n[001-002]", ["rack1-n001", "rack1-n002"]),
])
def test_nodelist_expands_like_scontrol_show_hostnames(nodelist, hosts):
    assert slurm.expand_nodelist(nodelist) == hosts


def test_settings_come_from_slurm_inside_a_job_and_default_outside():
    assert (slurm.nodes(SLURM_JOB), slurm.node_rank(SLURM_JOB), slurm.coordinator(SLURM_JOB)) == (
        4, 2, "gpu07:29500")
    assert (slurm.nodes({}), slurm.node_rank({}), slurm.coordinator({})) == (1, 0, None)


def _conf(*overrides: str):
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["size=tiny", *overrides])
    return validate(cfg)


@pytest.mark.parametrize("framework", ["torch", "tensorflow", "jax"])
def test_hardware_nodes_default_to_slurm_for_every_framework(monkeypatch, tmp_path, framework):
    """The job spec, which torchrun's arguments, jax.distributed and TF_CONFIG are built from,
    carries SLURM's node count, this node's rank and node 0's address."""
    for key, value in SLURM_JOB.items():
        monkeypatch.setenv(key, value)
    conf, arch = _conf(f"framework={framework}")
    spec = job_spec(conf, arch, tmp_path)
    assert (spec.nodes, spec.node_rank, spec.coordinator) == (4, 2, "gpu07:29500")
    if framework == "torch":
        cmd = worker_command(spec, sys.executable, tmp_path / "spec.json")
        assert {"--nnodes=4", "--node-rank=2"} <= set(cmd) and any("gpu07" in a for a in cmd)


def test_explicit_hardware_keys_win_over_slurm(monkeypatch, tmp_path):
    for key, value in SLURM_JOB.items():
        monkeypatch.setenv(key, value)
    conf, _ = _conf("hardware.nodes=2", "hardware.node_rank=1", "hardware.coordinator=head:1234")
    assert (conf.hardware.nodes, conf.hardware.node_rank, conf.hardware.coordinator) == (
        2, 1, "head:1234")


def test_outside_slurm_one_node(monkeypatch):
    for key in (*SLURM_JOB, "SLURM_NODELIST", "SLURM_JOB_NUM_NODES"):
        monkeypatch.delenv(key, raising=False)
    conf, _ = _conf()
    assert (conf.hardware.nodes, conf.hardware.node_rank, conf.hardware.coordinator) == (1, 0, None)


# ---- a real cluster -------------------------------------------------------------------------

def _cluster_state() -> str | None:
    """Why there is no usable cluster, or None when a node is up."""
    if not shutil.which("sbatch"):
        return "slurm-wlm is not installed (.ci/slurm.sh installs and starts a one-node cluster)"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo failed: {e}"
    if not any(s.strip().rstrip("*") in ("idle", "mixed", "allocated") for s in out.stdout.split()):
        said = out.stdout.strip() or out.stderr.strip()
        return f"no SLURM node is up (sinfo: {said}); run .ci/slurm.sh"
    return None


_NO_CLUSTER = _cluster_state()
needs_cluster = pytest.mark.skipif(_NO_CLUSTER is not None,
                                   reason=f"no SLURM cluster: {_NO_CLUSTER}")


def _start_sweep(tmp_path: Path, name: str) -> subprocess.Popen:
    """``python -m fxtrack -m hydra/launcher=slurm framework=torch,jax size=tiny ...``: two 1-CPU
    jobs side by side on the 2-CPU node (cpus_per_task=1; no GPU or memory request)."""
    # the two 1-CPU jobs would calibrate, contended: a cache of their own
    env = {k: v for k, v in fxtrack_env(tmp_path, seed_peak_cache(tmp_path / "cache")).items()
           if not k.startswith("SLURM_")}
    cmd = [sys.executable, "-m", "fxtrack", "-m", "hydra/launcher=slurm", "framework=torch,jax",
           "size=tiny", "batch_size=2", "steps=2", "warmup_steps=1", "hardware=cpu",
           "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=null",
           "hydra.launcher.gpus_per_node=null", "hydra.launcher.timeout_min=15",
           f"hydra.launcher.name={name}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _squeue(name: str) -> dict[str, tuple[str, str]]:
    """This sweep's jobs in the queue: submitit's id (``12_1``: array 12, job 1 of the sweep)
    -> (its own SLURM_JOB_ID, state)."""
    out = subprocess.run(["squeue", "-h", "-r", "-n", name, "-o", "%i %A %T"],
                         capture_output=True, text=True, timeout=30).stdout
    return {i: (a, t) for i, a, t in (line.split() for line in out.splitlines() if line.strip())}


def _watch(proc: subprocess.Popen, name: str, act=None, timeout_s: float = 1100):
    """Poll squeue until the sweep ends: {submitit id: SLURM_JOB_ID} of the jobs seen RUNNING,
    and the sweep's output. ``act(queue)`` is called each poll until it returns True."""
    running: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        queue = _squeue(name)
        for job, (job_id, state) in queue.items():
            if state == "RUNNING":  # pending, an array element shows the array's id, not its own
                running[job] = job_id
        if act is not None and act(queue):
            act = None
        time.sleep(0.5)
    if proc.poll() is None:
        proc.kill()
    return running, proc.communicate()[0]


def _runs(tmp_path: Path):
    """(the sweep's parent runs, {framework: child run}) in tmp_path/mlflow.db."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("fxtrack").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {r.data.tags["fxtrack.framework"]: r for r in runs if r not in parents}
    return parents, children


@pytest.mark.slurm
@pytest.mark.timeout(1200)
@needs_cluster
def test_sweep_jobs_run_as_slurm_jobs_under_one_parent(tmp_path):
    name = f"fxt-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    running, output = _watch(_start_sweep(tmp_path, name), name)
    print(f"2-job SLURM sweep: {time.monotonic() - t0:.0f} s")  # for the record (-s shows it)
    assert not _squeue(name), "jobs left in the queue"
    (parent,), children = _runs(tmp_path)
    assert parent.info.status == "FINISHED", output[-3000:]
    assert set(children) == {"torch", "jax"}, output[-3000:]
    job_ids = set(running.values())
    for framework, run in children.items():
        assert run.info.status == "FINISHED", (framework, run.data.tags.get("fxtrack.error"))
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["fxtrack.slurm_job_id"] in job_ids  # ran as a job squeue showed
    assert len({r.data.tags["fxtrack.slurm_job_id"] for r in children.values()}) == 2


@pytest.mark.slurm
@pytest.mark.timeout(1200)
@needs_cluster
def test_a_cancelled_job_fails_while_the_other_finishes(tmp_path):
    """scancel the JAX job (job 1) once its worker started: SLURM sends SIGTERM to the job's
    processes, the worker stops, and the job's orchestrator logs a KILLED run and ends normally
    (within KillWait=30 s, before SIGKILL) so submitit hands the sweep its result; the torch job
    finishes and the sweep's parent ends FAILED."""
    name = f"fxt-{uuid.uuid4().hex[:8]}"
    worker_log = tmp_path / "sweep" / "1" / "worker.log"
    cancelled = []

    def cancel_jax(queue):
        job = next((j for j, (_, state) in queue.items()
                    if j.endswith("_1") and state == "RUNNING"), None)
        if job is None or not worker_log.exists():
            return False
        subprocess.run(["scancel", job], check=True, timeout=30)
        cancelled.append(queue[job][0])
        return True

    _, output = _watch(_start_sweep(tmp_path, name), name, cancel_jax)
    assert cancelled, f"the JAX job was never seen running its worker:\n{output[-3000:]}"
    assert not _squeue(name), "jobs left in the queue"
    (parent,), children = _runs(tmp_path)
    assert children["torch"].info.status == "FINISHED", output[-3000:]
    jax = children["jax"]
    assert jax.info.status in ("FAILED", "KILLED"), output[-3000:]
    assert jax.data.tags["fxtrack.slurm_job_id"] == cancelled[0]
    assert "SIGTERM" in jax.data.tags.get("fxtrack.error", ""), jax.data.tags.get("fxtrack.error")
    assert parent.info.status == "FAILED"  # one job of the sweep failed
    assert "1 of 2 jobs failed" in output
