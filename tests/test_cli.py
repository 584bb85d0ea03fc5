"""End to end through the real CLI into a temporary MLflow store: one run, a sweep with a parent,
and failures (timeout, missing interpreter) that become FAILED runs while the sweep goes on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
torch = pytest.importorskip("torch")

from fxtrack import architectures  # noqa: E402
from fxtrack.frameworks.torch import models  # noqa: E402
from conftest import fxtrack_env, run_fxtrack  # noqa: E402

TINY_VIT = ["framework=torch", "model=vit", "model.layers=2", "model.image_size=32",
            "batch_size=2", "steps=3", "warmup_steps=1", "framework.compile=false"]
METRICS = ["throughput_samples_per_s", "step_time_ms_p50", "step_time_ms_p90", "step_time_ms_p99",
           "step_time_ms_mean", "step_time_ms_std", "step_time_cv", "first_step_time_s",
           "peak_rss_mib", "param_count", "loss_first", "loss_last"]
HOST_TAGS = ["fxtrack.framework", "fxtrack.framework_version", "fxtrack.model", "fxtrack.scenario",
             "fxtrack.status", "fxtrack.result_id", "fxtrack.device", "fxtrack.cpu",
             "fxtrack.host", "fxtrack.python", "fxtrack.version"]


def runs(cwd: Path) -> list:
    """Every run of the ``fxtrack`` experiment in ``cwd/mlflow.db``, oldest first."""
    client = mlflow.MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("fxtrack")
    return client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])


def test_single_run_lands_in_the_embedded_default_store(tmp_path):
    proc = run_fxtrack(tmp_path, *TINY_VIT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    # what differs from the defaults (size, batch, steps, the forced compile) is in the name,
    # on the console and in MLflow alike
    name = "torch-vit-train-fp32-x1-image_size32-layers2-b2-s3-compile_false"
    assert f"{name}:" in proc.stderr and "samples/s" in proc.stderr
    (run,) = runs(tmp_path)
    assert run.info.run_name == name
    assert run.info.status == "FINISHED"
    for key in METRICS:
        assert key in run.data.metrics, key
    with torch.device("meta"):
        expected = models.build(architectures.resolve("vit", layers=2, image_size=32))
    assert run.data.metrics["param_count"] == sum(p.numel() for p in expected.parameters())
    assert "peak_mem_device_mib" not in run.data.metrics  # no device counter on a CPU: absent
    for key in HOST_TAGS:
        assert run.data.tags.get(key), key
    assert run.data.tags["fxtrack.framework"] == "torch"
    assert run.data.tags["fxtrack.status"] == "ok"
    p = run.data.params
    assert (p["model.layers"], p["model.image_size"], p["batch_size"], p["steps"]) == ("2", "32", "2", "3")
    assert p["framework.name"] == "torch" and p["precision.name"] == "fp32"
    assert not any(k.startswith("hydra") for k in p)
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {
        "config.yaml", "result.json", "environment.json", "worker.log"}
    assert len(client.get_metric_history(run.info.run_id, "step_time_ms")) == 3
    assert len(client.get_metric_history(run.info.run_id, "loss")) == 4  # warm-up + timed
    assert not any((tmp_path / "home" / "spool").iterdir())  # delivered, so no longer spooled


def test_multirun_is_one_parent_with_linked_children(tmp_path):
    proc = run_fxtrack(tmp_path, "-m", *TINY_VIT[1:], "framework=torch", "seed=0,1", timeout=600)
    assert proc.returncode == 0, proc.stderr
    all_runs = runs(tmp_path)
    parents = [r for r in all_runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in all_runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    assert parents[0].info.status == "FINISHED"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert sorted(c.data.params["seed"] for c in children) == ["0", "1"]
    assert "job 2/2" in proc.stderr and "torch-vit-train-fp32-x1" in proc.stderr
    assert len({c.info.run_name for c in children}) == 2  # seed=0,1: -seed1 tells them apart


def test_timeout_and_missing_interpreter_fail_while_the_sweep_goes_on(tmp_path):
    proc = run_fxtrack(tmp_path, "-m", *TINY_VIT,
                       "timeout_s=0.5,600", "framework.python=null,/nonexistent/python",
                       timeout=600)
    assert proc.returncode == 1, proc.stderr
    children = [r for r in runs(tmp_path) if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 4
    # framework.python=null is logged as the interpreter that ran the worker
    by = {(c.data.params["timeout_s"], c.data.params["framework.python"]): c for c in children}
    assert ("600.0", sys.executable) in by
    ok = by[("600.0", sys.executable)]
    assert ok.info.status == "FINISHED" and ok.data.tags["fxtrack.status"] == "ok"
    timed_out = by[("0.5", sys.executable)]
    assert timed_out.info.status == "FAILED"
    assert "timed out after timeout_s=0.5" in timed_out.data.tags["fxtrack.error"]
    assert timed_out.data.tags["fxtrack.status"] == "failed"
    missing = by[("600.0", "/nonexistent/python")]
    assert missing.info.status == "FAILED"
    assert "framework.python=/nonexistent/python" in missing.data.tags["fxtrack.error"]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert "worker.log" in {a.path for a in client.list_artifacts(timed_out.info.run_id)}
    parent = [r for r in runs(tmp_path) if "mlflow.parentRunId" not in r.data.tags][0]
    assert parent.info.status == "FAILED"
    assert "jobs failed" in proc.stderr


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_mlflow_run_entry_point_logs_into_the_run_mlflow_created(tmp_path, framework):
    pytest.importorskip(framework)
    repo = Path(__file__).resolve().parents[1]
    env = fxtrack_env(tmp_path, {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}",
                                 "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    mlflow_bin = str(Path(sys.executable).with_name("mlflow"))
    proc = subprocess.run([mlflow_bin, "run", str(repo), "-P", f"framework={framework}",
                           "-P", "model=vit", "-P",
                           "overrides=size=tiny batch_size=2 steps=2 warmup_steps=1 framework.compile=false",
                           "--env-manager", "local"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    all_runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    (run,) = all_runs  # no second run, no second experiment: fxtrack adopted mlflow run's run
    assert run.info.run_name == f"{framework}-vit-train-fp32-x1-tiny-b2-s2-compile_false"
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlflow.project.entryPoint"] == "main"
    assert "throughput_samples_per_s" in run.data.metrics
    assert run.data.params["model.layers"] == "2"
    assert run.data.params["fxtrack.resolved.steps"] == "2"  # mlflow run logged steps=null first


def test_framework_start_up_noise_stays_in_the_log_not_the_terminal(capfd):
    import io

    from fxtrack.orchestrator.runner import _tee

    out = (b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
           b"I0000 00:00:1795992573.614361   20630 port.cc:153] oneDNN custom operations are on.\n"
           b"[fxtrack] building vit\n")
    log = io.BytesIO()
    _tee(io.BufferedReader(io.BytesIO(out)), log, echo=True, quiet=True)
    assert log.getvalue() == out
    assert capfd.readouterr().err == "[fxtrack] building vit\n"
    _tee(io.BufferedReader(io.BytesIO(out)), io.BytesIO(), echo=True, quiet=False)  # verbose=true
    assert capfd.readouterr().err == out.decode()


def test_summary_line_shows_what_each_scenario_measured():
    from fxtrack.worker.protocol import Result
    from fxtrack.tracking.records import summary_line

    ckpt = Result("r", status="FINISHED", metrics={"checkpoint_save_s": 0.5, "checkpoint_restore_s": 0.25,
                                                   "checkpoint_mib": 98.0, "export_s": 1.5,
                                                   "peak_rss_mib": 900.0})
    assert summary_line("torch-resnet50-checkpoint-fp32-x1", ckpt) == (
        "torch-resnet50-checkpoint-fp32-x1: save 0.50 s, restore 0.25 s, checkpoint 98 MiB, "
        "export 1.50 s, RSS peak 900 MiB")
    train = Result("r", status="FINISHED", guard="loss did not fall (1 -> 2)",
                   metrics={"throughput_samples_per_s": 12.34, "step_time_ms_p50": 81.0,
                            "step_time_cv": 0.2, "mfu": 0.031})
    line = summary_line("x", train)
    assert line.startswith("x: 12.3 samples/s, step p50 81.0 ms, MFU 3.1%")
    assert "WARNING: correctness guard: loss did not fall" in line and "noisy" in line
    assert summary_line("x", Result("r", error="boom")) == "x: FAILED: boom"


def test_every_scenario_lands_through_the_cli(tmp_path):
    proc = run_fxtrack(tmp_path, "-m", *TINY_VIT, "scenario=inference,pipeline,checkpoint",
                       "scenario.dataset_samples=32", "scenario.loader_workers=1", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    children = {r.data.tags["fxtrack.scenario"]: r for r in runs(tmp_path)
                if "mlflow.parentRunId" in r.data.tags}
    assert set(children) == {"inference", "pipeline", "checkpoint"}
    assert all(r.info.status == "FINISHED" for r in children.values())
    assert "input_bound_fraction" in children["pipeline"].data.metrics
    assert children["checkpoint"].data.metrics["checkpoint_restore_exact"] == 1.0
    assert children["checkpoint"].info.run_name.startswith("torch-vit-checkpoint-fp32-x1-image")
    assert "mfu" not in children["checkpoint"].data.metrics  # nothing timed, so no MFU
    assert not [k for k in children["checkpoint"].data.metrics if k.startswith("code_")]


def test_run_name_tells_config_variants_apart():
    """The run name (console lines, closing tables and MLflow alike) adds what differs from the
    defaults, so a deployment sweep's 24 rows, or a batch sweep's, never read the same
    (docs/contract.md#run-layout)."""
    from conftest import job_spec
    from fxtrack.tracking.records import run_name

    defaults = dict(size="full", compile_request="auto", batch_size=None, steps=None)
    plain = job_spec("torch", "bert", **defaults)
    assert run_name(plain) == "torch-bert-train-fp32-x1"
    tiny = job_spec("torch", "bert", **dict(defaults, size="tiny"))
    assert run_name(tiny, "tiny", repeat=1) == "torch-bert-train-fp32-x1-tiny-r1"
    int8 = job_spec("torch", "bert", scenario="inference", runtime="onnxruntime",
                    quantize="dynamic_int8", **defaults)
    assert run_name(int8) == "torch-bert-inference-fp32-x1-onnxruntime-dynamic_int8"
    forced = job_spec("jax", "vit", parallel="fsdp", memory="checkpoint", compile=False)
    assert run_name(forced, "tiny") == \
        "jax-vit-train-fp32-x1-tiny-b2-s3-fsdp-checkpoint-compile_false"
    assert len({run_name(job_spec("torch", "vit", batch_size=b), "tiny") for b in (2, 4)}) == 2
    layers = job_spec("torch", "vit", arch={"layers": 2}, **defaults)
    assert run_name(layers) == "torch-vit-train-fp32-x1-layers2"
    # model=custom: the builder this framework reads, once, then its kwargs (issue 30 item 8)
    builders = {"torch": "torchrealmodels:build_t5", "keras": "mypkg.models:build_keras",
                "jax": "mypkg.models:build_jax"}
    t5 = job_spec("torch", "custom", arch=builders, **dict(defaults, batch_size=2))
    assert run_name(t5) == "torch-custom[build_t5]-train-fp32-x1-b2"
    keras = job_spec("tensorflow", "custom", arch={**builders, "kwargs": {"width": 64}},
                     **defaults)
    assert run_name(keras) == "tensorflow-custom[build_keras]-train-fp32-x1-width64"
    # a scenario's named options off their default: two batching policies, two names
    serve = dict(defaults, scenario="serve", runner="fxtrack.scenarios.serve.runner:run")
    static = job_spec("jax", "llama", **serve, options={"batching": "static", "rate": "search"})
    assert run_name(static) == "jax-llama-serve-fp32-x1"
    continuous = job_spec("jax", "llama", **serve,
                          options={"batching": "continuous", "length_dist": "lognormal"})
    assert run_name(continuous) == "jax-llama-serve-fp32-x1-continuous-lognormal"


def test_a_server_that_refuses_connections_names_the_sync_command(tmp_path, capsys, isolated_store):
    """Preflight: the result will be spooled, and `fxtrack sync --uri URI` (credentials removed)
    delivers it, since a plain `fxtrack sync` retries the URI each result was spooled with."""
    from types import SimpleNamespace

    from fxtrack.orchestrator.app import preflight

    uri = "http://alice:s3cret@127.0.0.1:9"  # port 9 (discard): nothing listens, refused at once
    conf = SimpleNamespace(tracking=SimpleNamespace(uri=uri, experiment="fxtrack"))
    preflight(conf, str(tmp_path))
    err = capsys.readouterr().err
    assert "the result will be kept in the local spool" in err
    assert "`fxtrack sync --uri http://127.0.0.1:9`" in err and "a plain `fxtrack sync`" in err
    assert "s3cret" not in err and "alice" not in err
    assert err.count("\n") == 1
