"""parallel=fsdp and memory=checkpoint on CPU devices at tiny size: sharding really shards (each
of 2 ranks / devices holds about half of the parameter elements) and changes no math (the first
losses match the ddp run of the same seed within 1e-4); rematerialisation matches memory=none.

ViT, not ResNet, carries the fsdp parity check: a tiny ResNet-50 at batch 2 normalises its last
stages over 2 values per channel, so its loss moves by ~1e-2 with the kernel's rounding alone
(fp64 vs fp32, NCHW vs channels-last weights), which FSDP's contiguous shards change."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import backend_class, job_spec
from fxtrack.orchestrator.runner import TORCHRUN
from fxtrack.worker.__main__ import prepare_environment, run

RANKS = Path(__file__).with_name("levers_ranks.py")
TOL = 1e-4


@functools.lru_cache(maxsize=None)  # the jax ddp/none baseline serves two tests
def ranks(framework: str, model: str, parallel: str, memory: str, port: int,
          arch: str = "{}") -> dict[int, dict]:
    """levers_ranks.py on 2 devices: torchrun's 2 gloo ranks, or one JAX process, 2 host devices.
    ``arch``: JSON overrides of the model's dims (model=custom: its builder)."""
    cmd = [sys.executable, str(RANKS), framework, model, parallel, memory, "2", arch]
    if framework == "torch":
        cmd = [sys.executable, *TORCHRUN, "--nproc-per-node=2",
               f"--master-port={port}", *cmd[1:]]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=RANKS.parent)
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert lines, out.stderr[-3000:]
    return {line["rank"]: line for line in lines}


@pytest.mark.slow
@pytest.mark.parametrize("framework, port", [("torch", 29561), ("jax", 0)])
def test_fsdp_shards_the_parameters_and_keeps_the_math(framework, port):
    ddp = ranks(framework, "vit", "ddp", "none", port)
    fsdp = ranks(framework, "vit", "fsdp", "none", port + 1 if port else 0)
    for rank, shard in fsdp.items():
        assert shard["total"] == ddp[rank]["total"] == ddp[rank]["local"]  # ddp: a full replica
        assert shard["local"] == pytest.approx(shard["total"] / 2, rel=0.01)  # fsdp: half of it
        # parameters + AdamW's two moments, 4 bytes each: 12 bytes per parameter held
        assert ddp[rank]["state_bytes"] == pytest.approx(12 * shard["total"], rel=0.01)
        assert shard["state_bytes"] == pytest.approx(ddp[rank]["state_bytes"] / 2, rel=0.01)
        assert shard["losses"] == pytest.approx(ddp[rank]["losses"], abs=TOL)
        assert shard["losses"][-1] < shard["losses"][0]


@pytest.mark.slow
def test_jax_remat_matches_none():
    none = ranks("jax", "vit", "ddp", "none", 0)[0]["losses"]
    assert ranks("jax", "vit", "ddp", "checkpoint", 0)[0]["losses"] == pytest.approx(none, abs=TOL)


def _losses(framework: str, model: str, memory: str) -> list[float]:
    spec = job_spec(framework, model, memory=memory)
    prepare_environment(spec)
    backend = backend_class(spec)(spec)
    backend.device_kind()
    backend.build(2)
    return [backend.loss_value(backend.train_step()) for _ in range(3)]


@pytest.mark.parametrize("framework, model", [("torch", "resnet50"), ("torch", "vit")])
def test_activation_checkpointing_matches_none(framework, model):
    none = _losses(framework, model, "none")
    assert _losses(framework, model, "checkpoint") == pytest.approx(none, abs=TOL)


@pytest.mark.parametrize("lever, capability, says", [
    (dict(parallel="fsdp", devices=2), "sharded_state", "framework=torch"),
    (dict(memory="checkpoint"), "remat", "training="),
])
def test_tensorflow_lever_without_its_capability_is_a_not_supported_run(tmp_path, monkeypatch,
                                                                        lever, capability, says):
    """Refused by the worker from the declaration, before anything is built: the run is a
    not-supported cell whose error is the declared reason."""
    from fxtrack.frameworks.declaration import declaration
    from fxtrack.frameworks.tensorflow.backend import TensorFlowBackend

    def no_build(self, batch_size):
        raise AssertionError("built despite the declared absence")

    monkeypatch.setattr(TensorFlowBackend, "build", no_build)
    result = run(job_spec("tensorflow", "vit", tmp_path, **lever))
    assert result.status == "FAILED" and result.tags["unsupported"] == "true"
    field, value = next(iter(lever.items()))
    assert result.error.startswith(f"NotSupported: {field}={value} is not supported by tensorflow ")
    assert declaration("fxtrack.frameworks.tensorflow").absent[capability] in result.error
    assert says in result.error


def test_memory_table_gives_ratios_to_the_ddp_none_run():
    import pandas as pd

    from fxtrack.report import levers

    def run(parallel, memory, t, status="FINISHED", error=None, **metrics):
        row = {"run_id": f"{parallel}{memory}", "status": status, "start_time": t,
               "tags.fxtrack.framework": "torch", "tags.fxtrack.model": "vit",
               "tags.fxtrack.scenario": "train", "tags.fxtrack.precision": "fp32",
               "tags.fxtrack.devices": "2", "tags.fxtrack.hardware": "cpu",
               "params.parallel": parallel, "params.memory": memory, "tags.fxtrack.error": error}
        row.update({f"metrics.{k}": v for k, v in metrics.items()})
        return row

    frame = pd.DataFrame([run("ddp", "none", 1, peak_rss_mib=1000.0, throughput_samples_per_s=10.0,
                              state_mib_per_device=400.0),
                          run("fsdp", "none", 2, peak_rss_mib=600.0, throughput_samples_per_s=8.0,
                              state_mib_per_device=200.0),
                          run("ddp", "checkpoint", 3, peak_rss_mib=800.0,
                              throughput_samples_per_s=7.5, state_mib_per_device=400.0)])
    (table,) = levers.memory(frame)
    rows = {(r[3], r[4]): r[5:] for r in table.rows}
    assert rows[("fsdp", "none")] == ["600.0", "0.60x", "200.0", "0.50x", "8.0", "0.80x"]
    assert rows[("ddp", "checkpoint")] == ["800.0", "0.80x", "400.0", "1.00x", "7.5", "0.75x"]
    ratios = levers.ratios(frame).set_index("parallel")
    assert ratios.loc["fsdp", "memory_ratio_vs_baseline"] == pytest.approx(0.6)
    assert ratios.loc["fsdp", "state_ratio_vs_baseline"] == pytest.approx(0.5)
