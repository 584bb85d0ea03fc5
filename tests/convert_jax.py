"""Test tooling: copy a PyTorch reference model's weights (fxtrack's torch models, or Hugging
Face's LlamaForCausalLM for the Llama) into the Flax NNX model of the same architecture, so that
parity tests can compare outputs, losses, gradients and generated tokens.

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
        _write(flax_model, path, value, key)
        written.add(path)
    missing = expected - written
    if missing:
        raise ValueError(f"Flax variables not written from torch: {sorted(missing)[:5]}")


# Hugging Face LlamaForCausalLM name -> the Flax Llama's path (fxtrack.frameworks.jax.models),
# and whether the tensor is a Linear weight ((out, in) in torch, (in, out) in Flax).
_HF_LLAMA = [
    (r"model\.embed_tokens\.weight", "embed_tokens.embedding", False),
    (r"model\.layers\.(\d+)\.(input_layernorm|post_attention_layernorm)\.weight",
     r"blocks.\1.\2.scale", False),
    (r"model\.layers\.(\d+)\.self_attn\.(q|k|v|o)_proj\.weight",
     r"blocks.\1.self_attn.\2_proj.kernel", True),
    (r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.weight", r"blocks.\1.mlp.\2_proj.kernel",
     True),
    (r"model\.norm\.weight", "norm.scale", False),
    (r"lm_head\.weight", "lm_head.kernel", True),
]


def hf_llama_to_flax(state: dict[str, np.ndarray], flax_model: nnx.Module) -> None:
    """Overwrite every parameter of the Flax Llama with a Hugging Face LlamaForCausalLM's
    ``state`` (name -> NumPy array). A tied model's ``lm_head.weight`` is the embedding itself
    and is skipped; every Flax parameter must be written."""
    expected = {path for path, _ in nnx.to_flat_state(nnx.state(flax_model, nnx.Param))}
    written = set()
    for key, value in state.items():
        if key == "lm_head.weight" and flax_model.lm_head is None:
            continue  # tied: the embedding already holds it
        for pattern, target, linear in _HF_LLAMA:
            if re.fullmatch(pattern, key):
                path = tuple(int(n) if n.isdigit() else n
                             for n in re.sub(pattern, target, key).split("."))
                break
        else:
            raise ValueError(f"no Flax path for Hugging Face parameter {key}")
        _write(flax_model, path, value.T if linear else value, key)
        written.add(path)
    missing = expected - written
    if missing:
        raise ValueError(f"Flax parameters not written from Hugging Face: {sorted(missing)[:5]}")


def _write(flax_model: nnx.Module, path: tuple, value: np.ndarray, source: str) -> None:
    node = flax_model
    for part in path[:-1]:
        node = node[part] if isinstance(part, int) else getattr(node, part)
    var = getattr(node, path[-1])
    if var.shape != value.shape:
        raise ValueError(f"{source} -> {path}: shape {value.shape} != Flax {var.shape}")
    var.set_value(jnp.asarray(value, var.dtype))
