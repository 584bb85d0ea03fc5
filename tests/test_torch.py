"""PyTorch models and backend on tiny settings; canonical sizes counted on the meta device."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from fxtrack import architectures, flops  # noqa: E402
from fxtrack.frameworks.torch import models  # noqa: E402
from fxtrack.job import Result  # noqa: E402
from fxtrack.scenarios import train  # noqa: E402
from fxtrack.worker.__main__ import load, run  # noqa: E402


@pytest.mark.parametrize("model", architectures.MODELS)
def test_canonical_parameter_counts(model):
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        net = models.build(architectures.resolve(model))
    assert sum(p.numel() for p in net.parameters() if p.requires_grad) == \
        architectures.PARAM_COUNTS[model]


@pytest.mark.parametrize("model", ["resnet50", "bert", "vit"])
def test_loss_falls_over_20_steps(spec_factory, model):
    spec = spec_factory("torch", model, steps=19, warmup_steps=1)
    result = Result(spec.result_id)
    train.run(load(spec.backend)(spec), result)
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


def test_gpu_requested_without_gpu_fails_clearly(spec_factory):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = run(spec_factory("torch", "vit", hardware="gpu"))
    assert result.status == "FAILED"
    assert "hardware=gpu, but PyTorch sees no CUDA device" in result.error


def test_same_seed_same_weights_and_loss(spec_factory):
    a, b = (run(spec_factory("torch", "bert")) for _ in range(2))
    assert a.series["loss"] == b.series["loss"]


@pytest.mark.parametrize("model", ["resnet50", "bert", "vit"])
def test_architecture_flops_match_flop_counter(model):
    """Training FLOPs per sample from the table vs torch's FlopCounterMode, canonical size."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from fxtrack.frameworks.torch.data import device_batch
    from fxtrack.frameworks.torch.train import loss_fn

    arch = architectures.resolve(model)
    with torch.device("meta"):
        net = models.build(arch)
    batch = {k: v.to("meta") for k, v in device_batch(arch, 1, 0, torch.device("cpu"), False).items()}
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):  # the math path shows attention as matmuls
        loss_fn(net, batch).backward()
    counted = counter.get_total_flops()
    expected = flops.train_flops_per_sample(arch)
    assert abs(counted - expected) / expected < 0.05, (counted, expected)
