"""model=custom in PyTorch: the user's ``nn.Module``, its CPU tensors and loss, trained by
fxtrack's step (device, autocast, GradScaler, torch.compile, DDP, FSDP2 and activation
checkpointing on its policy's blocks) as its own models are; FLOPs
from ``torch.utils.flop_counter.FlopCounterMode`` over one forward + backward."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import nn

from fxtrack.frameworks import user_builder as ub
from fxtrack.frameworks.torch import FRAMEWORK, devices, models, parallel, train


def build(backend: Any, batch_size: int) -> None:
    spec, arch, fw = backend.spec, backend.arch, backend.framework
    torch.manual_seed(spec.seed)
    # Each data-parallel rank its own batch, as for fxtrack's models: seed offset by rank.
    model, inputs, targets, user_loss = ub.call(arch, fw, batch_size, spec.seed + parallel.rank())
    backend.seq_len = ub.sequence_length(arch, fw, inputs)
    ub.expect(isinstance(model, nn.Module), arch, fw, "a model", "a torch.nn.Module", model)
    for x in ub.leaves(inputs) + ub.leaves(targets):
        ub.expect(isinstance(x, torch.Tensor), arch, fw, "an input or target", "torch.Tensor",
                  x)
    # the policy's blocks, checked before anything is moved or timed (a misnamed class: one line)
    shard_units, remat_units = blocks(backend, model)
    device = backend.device
    model = model.to(device)
    model.train()
    if spec.memory == "checkpoint":  # activations recomputed per block in backward
        models.checkpoint_blocks(remat_units)
    backend.model = model
    backend.channels_last = False
    move = lambda x: x.to(device, non_blocking=True)  # noqa: E731
    backend.batch = (ub.tree_map(move, inputs), ub.tree_map(move, targets))
    wrapped = parallel.wrap(model, device, spec.parallel, shard_units)
    backend.opt = train.optimizer(model, arch, device, batch_size * parallel.world_size())
    backend.eager_loss = forward_loss(wrapped, user_loss, spec.precision, device)
    check_scalar(backend, backend.eager_loss)
    backend.loss = backend.eager_loss
    if spec.compile:
        backend.loss = train.compile_loss(backend.loss, FRAMEWORK.setting(spec, "compile_mode"))
    backend.batch_size = batch_size
    backend.use_step(train.make_step(backend.loss, backend.opt, spec.precision, device,
                                     functools.partial(devices.sync, device)))


def blocks(backend: Any, model: nn.Module) -> tuple[list[nn.Module], list[nn.Module]]:
    """(FSDP2 units, checkpointed blocks) of the user's model under ``user_builder``'s policy
    (model.shard_modules / model.remat_modules, or the items of its first ``nn.ModuleList`` /
    ``nn.Sequential`` of 2 or more modules of one class), each found when its lever is asked or
    its key is set; the units innermost first, as FSDP2 wants them."""
    spec, arch, fw = backend.spec, backend.arch, backend.framework
    asked = {"shard_modules": spec.parallel == "fsdp", "remat_modules": spec.memory == "checkpoint"}
    found = {key: ub.policy_blocks(arch, fw, model, key, nn.Module.named_children,
                                   lambda m: isinstance(m, (nn.ModuleList, nn.Sequential)))
             if on or arch.dims.get(key) else [] for key, on in asked.items()}
    return found["shard_modules"][::-1], found["remat_modules"]


def abstract_param_count(backend: Any) -> int:
    """The memory pre-check's count: the builder called under torch's ``meta`` device
    (parameters with shapes and no storage) at ub.ABSTRACT_BATCH, its trainable parameters."""
    arch, fw = backend.arch, backend.framework
    with torch.device("meta"):
        model = ub.call(arch, fw, ub.ABSTRACT_BATCH, backend.spec.seed)[0]
    ub.expect(isinstance(model, nn.Module), arch, fw, "a model", "a torch.nn.Module", model)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def forward_loss(model: nn.Module, user_loss: Callable[[Any, Any], torch.Tensor],
                 precision: str, device: torch.device) -> Callable[[tuple], torch.Tensor]:
    """(inputs, targets) -> the user's loss in float32, the forward under autocast as fxtrack's
    own models run (``train.forward_loss``), so that torch.compile captures both."""
    amp = train.AMP_DTYPES[precision]

    def fn(batch: tuple) -> torch.Tensor:
        inputs, targets = batch
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            return user_loss(ub.apply(model, inputs), targets).float()

    return fn


def check_scalar(backend: Any, loss: Callable[[tuple], torch.Tensor]) -> None:
    """One forward without gradients before any timed work: the loss must be a scalar."""
    with torch.no_grad():
        value = loss(backend.batch)
    ub.expect(isinstance(value, torch.Tensor) and value.ndim == 0, backend.arch,
              backend.framework, "a loss", "loss_fn(outputs, targets) -> a scalar tensor (shape "
              f"()), got shape {tuple(getattr(value, 'shape', ()))}", value)


def train_flops_per_sample(backend: Any) -> tuple[float, str]:
    """FlopCounterMode over one forward + backward of the eager loss (no optimiser step: the
    weights stay as they are), per sample."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        backend.eager_loss(backend.batch).backward()
    backend.opt.zero_grad(set_to_none=True)
    return counter.get_total_flops() / backend.batch_size, "torch.utils.flop_counter"


def prepare_inference(backend: Any) -> Callable[[], None]:
    """scenario=inference: the user's model in eval mode, compiled as its training step was,
    forward only on the resident inputs (``train.make_inference_step``'s rules)."""
    spec, device = backend.spec, backend.device
    backend.model.eval()
    runnable = backend.model
    if spec.compile:
        mode = FRAMEWORK.setting(spec, "compile_mode")
        runnable = torch.compile(backend.model, mode=None if mode == "default" else mode)
    amp, inputs = train.AMP_DTYPES[spec.precision], backend.batch[0]

    def step() -> None:
        with torch.inference_mode(), torch.autocast(device.type, dtype=amp or torch.float32,
                                                    enabled=amp is not None):
            ub.apply(runnable, inputs)
        devices.sync(device)

    return step


def forward_flops_per_sample(backend: Any) -> tuple[float, str]:
    """FlopCounterMode over one eval-mode forward, per sample."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        ub.apply(backend.model, backend.batch[0])
    return counter.get_total_flops() / backend.batch_size, "torch.utils.flop_counter"


def export(backend: Any, directory: Any) -> Callable[[], None]:
    """scenario=checkpoint's serving export (capability ``user_serving_export``): the user's
    model in eval mode through ``torch.export`` (its inputs as positional or keyword arguments,
    as ``model(...)`` is called), saved as ``.pt2``, loaded back as a server would; a synced
    forward of the loaded program on the resident inputs."""
    model, inputs = backend.model, backend.batch[0]
    model.eval()
    if isinstance(inputs, dict):
        args, kwargs = (), dict(inputs)
    else:
        args, kwargs = (tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)), {}
    path = directory / "model.pt2"
    torch.export.save(torch.export.export(model, args, kwargs), path)
    backend.served = torch.export.load(path).module()
    served, device = backend.served, backend.device

    def step() -> None:
        with torch.inference_mode():
            ub.apply(served, inputs)
        devices.sync(device)

    return step


def export_error(backend: Any) -> float:
    """The largest relative error of the loaded export's floating outputs against the live
    model's (eval mode, fp32, the same inputs): ``max|a - b| / max|b|`` over every output."""
    inputs = backend.batch[0]
    with torch.inference_mode():
        live = ub.leaves(plain(ub.apply(backend.model, inputs)))
        served = ub.leaves(plain(ub.apply(backend.served, inputs)))
    worst = 0.0
    for a, b in zip(served, live):
        if isinstance(b, torch.Tensor) and b.is_floating_point():
            scale = b.abs().max().clamp_min(1e-12)
            worst = max(worst, float((a.float() - b.float()).abs().max() / scale))
    return worst


def plain(outputs: Any) -> Any:
    """A ``ModelOutput`` (Hugging Face) or any mapping as a plain dict of its tensors."""
    if hasattr(outputs, "items") and not isinstance(outputs, dict):
        return dict(outputs.items())
    return outputs
