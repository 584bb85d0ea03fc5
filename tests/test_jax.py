"""JAX backend: parameter counts, parity with PyTorch, training, FLOPs, worker runs, Grain's
batches (CPU, tiny). The scenario contract every framework keeps (gpu without a GPU, a falling
loss, generation, serving, checkpoint, inference, pipeline, two nodes) is
tests/test_conformance.py."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
nnx = pytest.importorskip("flax.nnx")
import optax  # noqa: E402

from fxtrack import architectures  # noqa: E402
from fxtrack.frameworks.jax import data, models, train  # noqa: E402
from fxtrack.frameworks.jax.backend import JaxBackend  # noqa: E402
from fxtrack.worker.__main__ import run  # noqa: E402

from conftest import hlo_dots, tiny_arch  # noqa: E402

CPU = jax.devices("cpu")[0]
# ResNet-50 at 32 px ends on 1x1 maps, so with batch 4 its last BatchNorms normalise over four
# values: fp32 torch is then itself 1.2% off its own float64 gradient norm. At 64 px (2x2 maps)
# fp32 is within 3e-4 of float64, so the tolerances test the implementation, not rounding.
PARITY_OVERRIDES = {"resnet50": dict(image_size=64)}


def rel_err(a, b) -> float:
    """max|a - b| / max|a|: the error relative to the reference's scale."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(a).max())


@pytest.mark.parametrize("name", architectures.models())
def test_param_count_matches_canonical(name):
    arch = architectures.resolve(name)
    abstract = nnx.eval_shape(lambda: models.build(arch))  # shapes only, nothing allocated
    leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
    # abstract all the way: llama_8b's 8B float32 parameters (32 GB) would not fit here
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert sum(x.size for x in leaves) == architectures.param_count(name)


def _torch_and_flax(name: str, dtype=np.float32, batch_size: int = 4):
    """The torch reference model, the Flax model holding its weights, and both batches."""
    torch = pytest.importorskip("torch")
    from convert_jax import torch_to_flax

    from fxtrack.frameworks.torch import data as torch_data
    from fxtrack.frameworks.torch import models as torch_models

    arch = tiny_arch(name, **PARITY_OVERRIDES.get(name, {}))
    torch.manual_seed(0)
    reference = torch_models.build(arch)
    # Abstract (nothing initialised, which saves seconds); the converter writes every variable.
    model = nnx.eval_shape(lambda: models.build(arch, dtype))  # float32 params, ``dtype`` compute
    torch_to_flax(reference, model)
    t_batch = torch_data.device_batch(arch, batch_size, 0, torch.device("cpu"), False)
    return arch, reference, model, t_batch, data.device_batch(arch, batch_size, 0, CPU)


def _torch_grad_norm(reference, t_batch) -> tuple[float, float]:
    """(loss, gradient global norm) of one training-mode forward + backward in torch."""
    from fxtrack.frameworks.torch.train import loss_fn

    reference.train()
    loss = loss_fn(reference, t_batch)
    loss.backward()
    norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in reference.parameters()))
    return float(loss.detach()), norm


def _jax_grad_norm(arch, model, j_batch) -> tuple[float, float]:
    """(loss, gradient global norm) of one training-mode forward + backward in JAX."""
    model.train()
    graphdef, state = train.init_state(model, train.optimizer(arch), "fp32")
    grads, loss, _ = jax.jit(train.grads_and_loss, static_argnums=0)(graphdef, state, j_batch)
    return float(loss), float(optax.tree.norm(grads))


@pytest.mark.parametrize("name", ["resnet50", "bert", "vit"])
def test_parity_with_torch(name):
    import torch

    from fxtrack.frameworks.torch.train import loss_fn

    arch, reference, model, t_batch, j_batch = _torch_and_flax(name)
    with jax.default_matmul_precision("highest"):
        # Eval mode (BatchNorm on running statistics): outputs and loss.
        reference.eval()
        model.eval()
        with torch.no_grad():
            t_out = reference(train.model_inputs(t_batch)).numpy()
            t_loss = float(loss_fn(reference, t_batch))
        j_out = nnx.jit(lambda m, x: m(x))(model, train.model_inputs(j_batch))
        assert rel_err(t_out, j_out) < 1e-4
        assert abs(t_loss - float(train.loss_fn(j_out, j_batch))) / t_loss < 1e-4

        if name == "resnet50":
            return  # training mode: test_resnet_gradient_parity_float64
        # Training mode: loss and gradient global norm.
        t_loss, t_norm = _torch_grad_norm(reference, t_batch)
        j_loss, j_norm = _jax_grad_norm(arch, model, j_batch)
    assert abs(t_loss - j_loss) / t_loss < 1e-4
    assert abs(t_norm - j_norm) / t_norm < 1e-3


@pytest.mark.slow  # 45 s on the shared 2-core machine (2026-12-04)
def test_resnet_gradient_parity_float64():
    """Training-mode ResNet-50 (BatchNorm on batch statistics), loss and gradient norm.

    The gradient from random weights is ill-conditioned enough (norm ~1.7e3 at 64 px, batch 4)
    that fp32 JAX lands 1.0e-3 and fp32 torch 3e-4 from their own float64 values (XLA's CPU
    reductions accumulate less exactly). In float64 the frameworks agree to ~1e-9, which tests
    the implementation, not rounding."""
    with jax.enable_x64(True):
        arch, reference, model, t_batch, j_batch = _torch_and_flax("resnet50", np.float64)
        nnx.update(model, jax.tree.map(lambda x: x.astype(np.float64), nnx.state(model)))
        j_batch["images"] = j_batch["images"].astype(np.float64)
        j_loss, j_norm = _jax_grad_norm(arch, model, j_batch)
    t_batch["images"] = t_batch["images"].double()
    t_loss, t_norm = _torch_grad_norm(reference.double(), t_batch)
    assert abs(t_loss - j_loss) / t_loss < 1e-9
    assert abs(t_norm - j_norm) / t_norm < 1e-6


@pytest.mark.parametrize("name", ["resnet50", "vit"])
def test_optimizer_matches_torch(name):
    """Three steps of optax's SGD (coupled L2) / AdamW move parameters as torch's optimisers do."""
    torch = pytest.importorskip("torch")
    from fxtrack.frameworks.torch.train import optimizer as torch_optimizer

    arch, rng = tiny_arch(name), np.random.default_rng(0)
    init = {"w": rng.standard_normal((3, 4)).astype(np.float32),
            "b": rng.standard_normal(4).astype(np.float32)}
    grads = [{k: rng.standard_normal(v.shape).astype(np.float32) for k, v in init.items()}
             for _ in range(3)]
    module = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.tensor(v))
                                     for k, v in init.items()})
    opt = torch_optimizer(module, arch, torch.device("cpu"))
    tx = train.optimizer(arch)
    params = jax.tree.map(jax.numpy.asarray, init)
    opt_state = tx.init(params)
    for g in grads:
        for k, p in module.items():
            p.grad = torch.tensor(g[k])
        opt.step()
        updates, opt_state = tx.update(g, opt_state, params)
        params = optax.apply_updates(params, updates)
    for k, p in module.items():
        np.testing.assert_allclose(np.asarray(params[k]), p.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_loss_scale_halves_on_overflow_and_grows_after_interval():
    scale = train.LossScale(jax.numpy.float32(8.0), jax.numpy.int32(0))
    scale = scale.update(jax.numpy.bool_(False))
    assert float(scale.scale) == 4.0 and int(scale.good_steps) == 0
    scale = train.LossScale(scale.scale, jax.numpy.int32(train.GROWTH_INTERVAL - 1))
    scale = scale.update(jax.numpy.bool_(True))
    assert float(scale.scale) == 8.0 and int(scale.good_steps) == 0
    assert int(scale.update(jax.numpy.bool_(True)).good_steps) == 1


@pytest.mark.parametrize("name", [pytest.param("resnet50", marks=pytest.mark.slow), "bert", "vit"])
def test_training_flops_per_sample(name):
    arch = architectures.resolve(name)
    flops = train.training_flops_per_sample(arch)
    print(f"\n{name}: XLA cost_analysis training FLOPs/sample = {flops / 1e9:.2f} GFLOP")
    assert flops > 0
    if importlib.util.find_spec("fxtrack.flops") is None:
        pytest.skip("fxtrack/flops.py (the architecture FLOP count) does not exist yet")
    from fxtrack.flops import train_flops_per_sample

    expected = train_flops_per_sample(arch)
    assert abs(flops - expected) / expected < 0.05, (flops, expected)


@pytest.mark.parametrize("precision,compile", [  # op-by-op bf16: 39 s, the jitted ones 5-10 s
    pytest.param("bf16", False, marks=pytest.mark.slow), ("fp32", True), ("fp16", True)])
def test_worker_runs_vit(spec_factory, precision, compile):
    result = run(spec_factory("jax", "vit", precision=precision, compile=compile, steps=2))
    assert result.status == "FINISHED", result.error
    assert math.isfinite(result.metrics["loss_last"])
    assert result.metrics["param_count"] > 0

# ----------------------------------------------------------------------------- scenario hooks
def test_inference_normalises_with_running_statistics(spec_factory):
    """In inference mode a sample's output does not depend on the rest of its batch."""
    backend = JaxBackend(spec_factory("jax", "resnet50", compile=True, batch_size=4))
    backend.device_kind()
    backend.build(4)
    forward = train.make_forward(train.eval_graphdef(backend.graphdef, backend.state))
    images, s = backend.batch["images"], backend.state
    whole, alone = forward(s.params, s.batch_stats, images), forward(s.params, s.batch_stats,
                                                                     images[:1])
    np.testing.assert_allclose(np.asarray(whole[:1]), np.asarray(alone), rtol=1e-4, atol=1e-4)


def _worker(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fxtrack.worker", *args], capture_output=True,
                          text=True, timeout=600, env=env, **kw)


def test_probes_print_devices_and_matmul_rate():
    package = "fxtrack.frameworks.jax"  # the probe's third word: the framework's package
    described = json.loads(_worker("--describe", "jax", package, "fp32", "cpu").stdout)
    assert described["installed"] and described["version"] == jax.__version__
    assert described["devices"] and described["devices"][0] == "cpu:0"
    rate = json.loads(_worker("--matmul", "jax", package, "fp32", "cpu").stdout)["tflops"]
    assert 1e-4 < rate < 100  # TFLOP/s of a CPU

def test_pipeline_does_the_per_sample_work(tmp_path, monkeypatch):
    """Grain's batches: shapes, dtypes and scale of fxtrack.data.on_disk; 15% dynamic masking."""
    pytest.importorskip("grain")
    from fxtrack.data import on_disk
    from fxtrack.frameworks.jax import pipeline

    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path / "cache"))
    arch = tiny_arch("bert")
    batch = next(pipeline.host_loader(on_disk.ensure(arch, 32, 0), 32, 0, seed=0))
    assert batch["input_ids"].shape == (32, arch.seq_len) and batch["input_ids"].dtype == np.int32
    assert 0.05 < batch["mlm_weights"].mean() < 0.3
    masked = batch["mlm_weights"] == 1
    assert (batch["input_ids"][masked] == architectures.BERT_MASK_TOKEN).all()
    assert (batch["input_ids"][~masked] == batch["mlm_labels"][~masked]).all()
    arch = tiny_arch("resnet50")
    batch = next(pipeline.host_loader(on_disk.ensure(arch, 8, 0), 4, 0, seed=0))
    assert batch["images"].shape == (4, arch.image_size, arch.image_size, 3)
    assert batch["images"].dtype == np.float32 and batch["labels"].dtype == np.int32
    assert np.abs(batch["images"]).max() <= 128 / on_disk.PIXEL_SCALE + 1e-6


@pytest.mark.parametrize("w_transposed", [False, True])
def test_bf16_matmul_and_its_gradients_match_the_plain_dot(w_transposed):
    """matmul's custom VJP: the same values and gradients as XLA's own dot of the same bf16
    operands (to bf16's rounding), for w (K, N) and a tied projection's w (N, K)."""
    from fxtrack.frameworks import xla_bf16 as matmul

    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (2, 24, 32)).astype(jax.numpy.bfloat16)
    w = jax.random.normal(kw, (48, 32) if w_transposed else (32, 48)).astype(jax.numpy.bfloat16)
    g = jax.random.normal(kg, (2, 24, 48))

    def loss(f, x, w):
        return (f(x, w).astype(jax.numpy.float32) * g).sum()

    def plain(x, w):  # float32 math on the bf16 values: the exact answer to compare with
        x, w = x.astype(jax.numpy.float32), w.astype(jax.numpy.float32)
        return (x @ (w.T if w_transposed else w)).astype(jax.numpy.bfloat16)

    fast = jax.jit(jax.value_and_grad(lambda x, w: loss(
        lambda a, b: matmul.matmul(a, b, w_transposed), x, w), argnums=(0, 1)))
    exact = jax.jit(jax.value_and_grad(lambda x, w: loss(plain, x, w), argnums=(0, 1)))
    (v1, (dx1, dw1)), (v2, (dx2, dw2)) = fast(x, w), exact(x, w)
    assert dx1.dtype == x.dtype and dw1.dtype == w.dtype and dw1.shape == w.shape
    np.testing.assert_allclose(float(v1), float(v2), rtol=1e-2)
    for a, b in ((dx1, dx2), (dw1, dw2)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.abs(a - b).max() <= 2e-2 * np.abs(b).max()


def test_bf16_training_dots_compile_to_the_bf16_kernel_form(monkeypatch):
    """On XLA:CPU every dot of a bf16 Linear's forward and backward reads bf16 operands,
    accumulates in float32 and contracts the left operand's last axis, the only form XLA:CPU
    runs on its bf16 kernels; XLA's own lowering of the same layer does not (the check can
    fail), or the fast path would be pointless."""
    from fxtrack.frameworks import xla_bf16 as matmul

    assert matmul.fast_path(jax.numpy.bfloat16, "cpu")[0]
    assert not matmul.fast_path(jax.numpy.float32, "cpu")[0]
    assert not matmul.fast_path(jax.numpy.bfloat16, "gpu")[0]

    def compiled_dots() -> list[tuple[str, list[str], str]]:
        layer = nnx.Linear(32, 48, dtype=jax.numpy.bfloat16, dot_general=matmul.dot_general,
                           rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(layer)
        x = jax.numpy.ones((16, 32), jax.numpy.bfloat16)

        def loss(params, x):
            return (nnx.merge(graphdef, params)(x).astype(jax.numpy.float32) ** 2).sum()

        step = jax.jit(jax.grad(loss, argnums=(0, 1)))  # the weight's and the input's gradients
        return hlo_dots(step.lower(params, x).compile().as_text())

    dots = compiled_dots()
    assert len(dots) == 3 and all(
        result == "f32" and operands == ["bf16", "bf16"] and lhs == "1"
        for result, operands, lhs in dots), dots
    monkeypatch.setattr(matmul, "ENABLED", False)
    assert not all(operands == ["bf16", "bf16"] and lhs == "1" for _, operands, lhs in
                   compiled_dots())


def test_the_bf16_peak_probe_computes_the_form_the_models_take():
    """The calibration's bf16 product on a CPU is the kernel form fxtrack's models take (bf16
    operands, float32 accumulation), not XLA's own bf16 dot, which is upcast to float32 and 5x
    slower: a peak taken from that put JAX's bf16 ViT-B/16 at 116% MFU."""
    from fxtrack.frameworks import xla_bf16

    a = jax.numpy.ones((256, 256), jax.numpy.bfloat16)
    dots = hlo_dots(xla_bf16.PROBE_PRODUCT.lower(a, a).compile().as_text())
    assert dots and all(result == "f32" and operands == ["bf16", "bf16"]
                        for result, operands, _ in dots), dots
    own = hlo_dots(jax.jit(jax.numpy.matmul).lower(a, a).compile().as_text())
    assert not all(operands == ["bf16", "bf16"] for _, operands, _ in own), own  # can fail


def test_bf16_run_takes_the_kernel_form_and_learns_alike(spec_factory, monkeypatch):
    """fxtrack's JAX BERT at bf16 on a CPU: tagged with the kernel form, and its first losses
    those of the same model with XLA's own dots."""
    from fxtrack.frameworks.base import BF16_KERNEL_FORM
    from fxtrack.frameworks import xla_bf16 as matmul

    def losses() -> tuple[list[float], dict]:
        backend = JaxBackend(spec_factory("jax", "bert", precision="bf16", compile=True))
        backend.device_kind()
        backend.build(4)
        return [float(backend.train_step()) for _ in range(3)], backend.device_tags()

    fast, tags = losses()
    monkeypatch.setattr(matmul, "ENABLED", False)
    plain, plain_tags = losses()
    assert tags["matmul_form"] == BF16_KERNEL_FORM != plain_tags["matmul_form"]
    np.testing.assert_allclose(fast, plain, rtol=2e-2)
    assert fast[-1] < fast[0]


def test_resnet_1x1_convolutions_run_as_the_products_they_are_on_a_cpu():
    """XLA:CPU runs a 1x1 convolution far below its matmul rate, so fxtrack's ResNet computes
    its 36 1x1 convolutions (strided ones included) as dots: the compiled forward keeps only the
    stem's 7x7 and the 16 3x3 convolutions, and computes what XLA's convolutions compute."""
    model = models.build(tiny_arch("resnet50"), jax.numpy.float32, nnx.Rngs(0))
    model.eval()
    x = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))
    graph, state = nnx.split(model)

    def forward(state, x):
        return nnx.merge(graph, state)(x)

    text = jax.jit(forward).lower(state, x).as_text()
    assert text.count("stablehlo.convolution") == 1 + 16, text.count("stablehlo.convolution")
    pointwise = [conv for _, conv in nnx.iter_graph(model)
                 if isinstance(conv, nnx.Conv) and conv.kernel_size == (1, 1)]
    assert len(pointwise) == 36
    y = forward(state, x)
    for conv in pointwise:  # XLA's own convolutions, same kernels
        conv.conv_general_dilated = jax.lax.conv_general_dilated
    reference = nnx.merge(*nnx.split(model))(x)
    assert rel_err(reference, y) < 1e-5
    from fxtrack.frameworks import xla_bf16

    assert xla_bf16.conv_form("cpu")[1] == xla_bf16.POINTWISE_AS_MATMUL
    assert not xla_bf16.conv_form("gpu")[0]
