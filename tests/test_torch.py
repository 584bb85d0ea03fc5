"""PyTorch models and backend on tiny settings; canonical sizes counted on the meta device. The
scenario contract every framework keeps (gpu without a GPU, checkpoint, inference, pipeline, two
nodes) is tests/test_conformance.py."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from fxtrack import architectures, flops  # noqa: E402
from fxtrack.frameworks.torch import models  # noqa: E402
from fxtrack.job import Result  # noqa: E402
from fxtrack.scenarios import train  # noqa: E402
from fxtrack.worker.__main__ import run  # noqa: E402
from conftest import backend_class  # noqa: E402


@pytest.mark.parametrize("model", architectures.MODELS)
def test_canonical_parameter_counts(model):
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        net = models.build(architectures.resolve(model))
    assert all(p.is_meta for p in net.parameters())  # llama_8b's 32 GB of fp32 never allocated
    assert sum(p.numel() for p in net.parameters() if p.requires_grad) == \
        architectures.PARAM_COUNTS[model]


@pytest.mark.parametrize("model", ["resnet50", "bert", "vit"])
def test_loss_falls_over_20_steps(spec_factory, model):
    spec = spec_factory("torch", model, steps=19, warmup_steps=1)
    result = Result(spec.result_id)
    train.run(backend_class(spec)(spec), result)
    losses = result.series["loss"]
    assert len(losses) == 20 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.5 * losses[0]
    assert result.guard == "ok"
    assert len(result.series["step_time_ms"]) == 19


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
