"""Test tooling: copy a PyTorch reference model's weights into the Flax NNX model of the same
architecture, so that parity tests can compare outputs, losses and gradients.

Torch and Flax modules carry the same attribute names; the few structural differences are
renamed below, and every tensor is laid out the JAX way (conv OIHW -> HWIO, Linear (out, in) ->
(in, out)). Every Flax parameter and batch statistic must be written exactly once.
"""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
from flax import nnx
from torch import nn

# torch name -> Flax name, for containers that differ between the two implementations.
_RENAMES = [
    (r"\.downsample\.(\d)\.", r".downsample.layers.\1."),  # nn.Sequential -> nnx.Sequential
    (r"\.mlp\.0\.", ".mlp.fc1."),  # nn.Sequential(Linear, GELU, Linear) -> Mlp.fc1 / fc2
    (r"\.mlp\.2\.", ".mlp.fc2."),
]
# torch leaf name -> Flax leaf name, per torch module type.
_LEAVES = {
    nn.Conv2d: {"weight": "kernel", "bias": "bias"},
    nn.Linear: {"weight": "kernel", "bias": "bias"},
    nn.Embedding: {"weight": "embedding"},
    nn.LayerNorm: {"weight": "scale", "bias": "bias"},
    nn.BatchNorm2d: {"weight": "scale", "bias": "bias", "running_mean": "mean",
                     "running_var": "var"},
}


def _layout(module: nn.Module, leaf: str, value: np.ndarray) -> np.ndarray:
    """A torch tensor in Flax's layout."""
    if isinstance(module, nn.Conv2d) and leaf == "weight":
        return value.transpose(2, 3, 1, 0)  # (O, I, kH, kW) -> (kH, kW, I, O)
    if isinstance(module, nn.Linear) and leaf == "weight":
        return value.T  # (out, in) -> (in, out)
    return value


def _flax_path(torch_key: str, module: nn.Module | None, leaf: str) -> tuple:
    prefix = "." + torch_key.rpartition(".")[0] + "."
    for pattern, repl in _RENAMES:
        prefix = re.sub(pattern, repl, prefix)
    names = [n for n in prefix.split(".") if n]
    if module is None:  # a bare nn.Parameter on the parent module (cls_token, mlm_bias, ...)
        name = leaf
    else:
        name = _LEAVES[type(module)][leaf]
    return tuple(int(n) if n.isdigit() else n for n in names) + (name,)


def torch_to_flax(torch_model: nn.Module, flax_model: nnx.Module) -> None:
    """Overwrite every parameter and BatchNorm statistic of ``flax_model`` with those of
    ``torch_model`` (same architecture)."""
    modules = dict(torch_model.named_modules())
    expected = {path for path, _ in nnx.to_flat_state(nnx.state(flax_model))}  # Params, BatchStats
    written = set()
    for key, tensor in torch_model.state_dict().items():
        if key.endswith("num_batches_tracked"):
            continue
        owner, _, leaf = key.rpartition(".")
        module = modules[owner] if type(modules[owner]) in _LEAVES else None
        path = _flax_path(key, module, leaf)
        value = _layout(module, leaf, tensor.detach().cpu().numpy()) if module else tensor.numpy()
        node = flax_model
        for part in path[:-1]:
            node = node[part] if isinstance(part, int) else getattr(node, part)
        var = getattr(node, path[-1])
        if var.shape != value.shape:
            raise ValueError(f"{key} -> {path}: shape {value.shape} != Flax {var.shape}")
        var.set_value(jnp.asarray(value, var.dtype))
        written.add(path)
    missing = expected - written
    if missing:
        raise ValueError(f"Flax variables not written from torch: {sorted(missing)[:5]}")
