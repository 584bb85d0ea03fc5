"""PyTorch models and backend on tiny settings; canonical sizes counted on the meta device. The
scenario contract every framework keeps (gpu without a GPU, training with a falling loss,
generation, serving, checkpoint, inference, pipeline, two nodes) is tests/test_conformance.py."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from fxtrack import architectures, flops  # noqa: E402
from fxtrack.frameworks.torch import models  # noqa: E402
from fxtrack.worker.__main__ import run  # noqa: E402


@pytest.mark.parametrize("model", architectures.models())
def test_canonical_parameter_counts(model):
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        net = models.build(architectures.resolve(model))
    assert all(p.is_meta for p in net.parameters())  # llama_8b's 32 GB of fp32 never allocated
    assert sum(p.numel() for p in net.parameters() if p.requires_grad) == \
        architectures.param_count(model)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_runs(spec_factory, precision):
    result = run(spec_factory("torch", "vit", precision=precision))
    assert result.status == "FINISHED", result.error
    assert math.isfinite(result.metrics["loss_last"])


def test_torch_compile_runs(spec_factory):
    result = run(spec_factory("torch", "vit", compile=True))
    assert result.status == "FINISHED", result.error
    assert result.metrics["loss_last"] < result.metrics["loss_first"]

def test_same_seed_same_weights_and_loss(spec_factory):
    a, b = (run(spec_factory("torch", "bert")) for _ in range(2))
    assert a.series["loss"] == b.series["loss"]


# Llama at a size where attention is ~15% of the total (seq 128): fxtrack.flops' PaLM count
# (6 N_matmul T + 12 L H T^2, the tied output projection a matmul, the embedding lookup none)
LLAMA_FLOPS = dict(hidden=128, seq_len=128, vocab_size=512, mlp_dim=256, layers=2)


@pytest.mark.parametrize("model", ["resnet50", "bert", "vit", "llama"])
def test_architecture_flops_match_flop_counter(model):
    """Training FLOPs per sample from the table vs torch's FlopCounterMode over one forward +
    backward, which counts every mm/bmm/conv torch runs (attention's QK^T and AV over the full
    T x T square on the math kernel: a causal mask is not discounted) but no norm, activation,
    RoPE or loss; canonical size (Llama: LLAMA_FLOPS)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from fxtrack.frameworks.torch.data import device_batch
    from fxtrack.frameworks.torch.train import loss_fn

    arch = architectures.resolve(model, "tiny", **LLAMA_FLOPS) if model == "llama" \
        else architectures.resolve(model)
    with torch.device("meta"):
        net = models.build(arch)
    batch = {k: v.to("meta") for k, v in device_batch(arch, 1, 0, torch.device("cpu"), False).items()}
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):  # the math path shows attention as matmuls
        loss_fn(net, batch).backward()
    counted = counter.get_total_flops()
    expected = flops.train_flops_per_sample(arch)
    if model == "llama":
        assert 12 * arch.layers * arch.hidden * arch.seq_len**2 > 0.1 * expected  # attention counts
    assert abs(counted - expected) / expected < 0.05, (counted, expected)


@pytest.mark.slow  # 66 s on the shared 2-core machine: two CLI processes, torchrun
def test_two_nodes_on_loopback_train_as_one_job(tmp_path):
    """Two node processes (torchrun static rendezvous on 127.0.0.1), one DDP rank each; node 0
    reports the global throughput to MLflow, node 1 logs nothing. The orchestrator's side of
    two nodes, through the CLI and MLflow, once (tests/test_conformance.py runs each
    framework's two-node workers)."""
    import subprocess
    import sys

    from conftest import fxtrack_env
    from servers import free_port

    coordinator = f"127.0.0.1:{free_port()}"
    env = fxtrack_env(tmp_path)
    procs = [subprocess.Popen(
        [sys.executable, "-m", "fxtrack", "framework=torch", "model=vit", "size=tiny",
         "batch_size=2", "steps=3", "warmup_steps=1", "framework.compile=false", "hardware=cpu",
         "hardware.nodes=2", f"hardware.node_rank={rank}", f"hardware.coordinator={coordinator}",
         f"hydra.run.dir={tmp_path / f'node{rank}'}"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in (0, 1)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (only,) = client.search_runs([client.get_experiment_by_name("fxtrack").experiment_id])
    assert only.info.status == "FINISHED"
    assert "node 1 finished" in outs[1]
    world = 2  # nodes x devices: throughput counts the global batch
    steps_s = only.data.metrics["step_time_ms_mean"] / 1e3
    assert only.data.metrics["throughput_samples_per_s"] == pytest.approx(2 * world / steps_s, rel=0.3)


RANK_SOCKETS = """
import json, os, psutil, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()  # every rank up: the store and gloo's sockets are all open now
if dist.get_rank() == 0:
    agent = psutil.Process(os.getppid())
    print(json.dumps(sorted({c.laddr.ip for p in [agent, *agent.children(recursive=True)]
                             for c in p.net_connections("tcp") if c.status == "LISTEN"})))
dist.barrier()
dist.destroy_process_group()
"""


def test_a_one_machine_torchrun_job_listens_on_loopback_only(tmp_path):
    """devices=2 on one machine: torchrun's rendezvous store (torch's own binds every
    interface) and gloo listen on 127.0.0.1 alone, through the launcher the orchestrator uses."""
    import json
    import subprocess
    import sys

    from fxtrack.orchestrator.runner import TORCHRUN

    script = tmp_path / "ranks.py"
    script.write_text(RANK_SOCKETS)
    proc = subprocess.run([sys.executable, *TORCHRUN, "--nproc-per-node=2", "--standalone",
                           str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("[")]
    assert json.loads(line) == ["127.0.0.1"], line  # the store's listener is among them
