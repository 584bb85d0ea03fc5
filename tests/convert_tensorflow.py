"""Test tooling: copy a PyTorch model's weights (fxtrack.frameworks.torch.models) into the Keras
model of the same ``Arch`` (fxtrack.frameworks.keras_models), layer by layer by name; and a
Hugging Face ``LlamaForCausalLM``'s state dict into the Keras Llama (``copy_hf_llama_to_keras``).

Layout changes: conv kernels OIHW -> HWIO, linear weights (out, in) -> dense kernels (in, out),
BatchNorm (weight, bias, running_mean, running_var) -> (gamma, beta, moving_mean,
moving_variance). Both frameworks fuse q, k and v into one projection laid out [q | k | v], and
both tie the MLM decoder to the word embeddings, so neither needs splitting or copying twice.
"""

from __future__ import annotations

from typing import Iterator

import keras
import numpy as np
import torch

from fxtrack.architectures import Arch


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().float().numpy()


def _conv(m: torch.nn.Conv2d) -> list[np.ndarray]:
    kernel = _np(m.weight).transpose(2, 3, 1, 0)  # (O, I, kh, kw) -> (kh, kw, I, O)
    return [kernel] if m.bias is None else [kernel, _np(m.bias)]


def _linear(m: torch.nn.Linear) -> list[np.ndarray]:
    return [_np(m.weight).T, _np(m.bias)]  # (out, in) -> (in, out)


def _norm(m: torch.nn.Module) -> list[np.ndarray]:
    if isinstance(m, torch.nn.BatchNorm2d):
        return [_np(m.weight), _np(m.bias), _np(m.running_mean), _np(m.running_var)]
    return [_np(m.weight), _np(m.bias)]  # LayerNorm: gamma, beta


def _resnet(tm: torch.nn.Module, arch: Arch) -> Iterator[tuple[str, list[np.ndarray]]]:
    yield "stem_conv", _conv(tm.conv1)
    yield "stem_bn", _norm(tm.bn1)
    blocks = iter(tm.blocks)
    for i, count in enumerate(arch.stage_sizes):
        for b in range(count):
            block, name = next(blocks), f"stage{i + 1}_block{b + 1}"
            for j in (1, 2, 3):
                yield f"{name}_conv{j}", _conv(getattr(block, f"conv{j}"))
                yield f"{name}_bn{j}", _norm(getattr(block, f"bn{j}"))
            if block.downsample is not None:
                yield f"{name}_downsample_conv", _conv(block.downsample[0])
                yield f"{name}_downsample_bn", _norm(block.downsample[1])
    yield "head", _linear(tm.fc)


def _blocks(tm: torch.nn.Module) -> Iterator[tuple[str, list[np.ndarray]]]:
    for i, block in enumerate(tm.blocks):
        yield f"block{i}_norm1", _norm(block.norm1)
        yield f"block{i}_attn_qkv", _linear(block.attn.qkv)  # (C, 3C), columns [q | k | v]
        yield f"block{i}_attn_proj", _linear(block.attn.proj)
        yield f"block{i}_norm2", _norm(block.norm2)
        yield f"block{i}_mlp_fc1", _linear(block.mlp[0])
        yield f"block{i}_mlp_fc2", _linear(block.mlp[2])


def _vit(tm: torch.nn.Module, arch: Arch) -> Iterator[tuple[str, list[np.ndarray]]]:
    yield "patch_embed", _conv(tm.patch_embed)
    yield "cls_token", [_np(tm.cls_token)]  # (1, 1, C)
    yield "pos_embed", [_np(tm.pos_embed)[0]]  # (1, tokens, C) -> (tokens, C)
    yield from _blocks(tm)
    yield "final_norm", _norm(tm.norm)
    yield "head", _linear(tm.head)


def _bert(tm: torch.nn.Module, arch: Arch) -> Iterator[tuple[str, list[np.ndarray]]]:
    yield "word_embeddings", [_np(tm.word_embeddings.weight)]  # (vocab, C), also the decoder
    yield "position_embeddings", [_np(tm.position_embeddings.weight)]
    yield "token_type_embeddings", [_np(tm.token_type_embeddings.weight)]
    yield "embed_norm", _norm(tm.embed_norm)
    yield from _blocks(tm)
    yield "mlm_dense", _linear(tm.mlm_dense)
    yield "mlm_norm", _norm(tm.mlm_norm)
    yield "mlm_bias", [_np(tm.mlm_bias)]


def copy_torch_to_keras(torch_model: torch.nn.Module, keras_model: keras.Model,
                        arch: Arch) -> None:
    """Overwrite every weight of ``keras_model`` with the matching one of ``torch_model``;
    fails if a layer is missing, a shape differs, or a Keras weight is left uncopied."""
    mapping = {"resnet": _resnet, "vit": _vit, "bert": _bert}[arch.family]
    copied = set()
    for name, arrays in mapping(torch_model, arch):
        layer = keras_model.get_layer(name)
        layer.set_weights(arrays)  # raises on a count or shape mismatch
        copied.add(name)
    missing = {layer.name for layer in keras_model.layers if layer.weights} - copied
    assert not missing, f"Keras layers with weights not copied from torch: {sorted(missing)}"


# Hugging Face LlamaForCausalLM parameter name -> the Keras Llama weight's path below the model
# (per layer, ``{i}`` filled in). Linear weights are (out, in): transposed to Dense kernels.
HF_LLAMA_LAYER = {
    "input_layernorm.weight": "attn_norm/scale",
    "self_attn.q_proj.weight": "q_proj/kernel",
    "self_attn.k_proj.weight": "k_proj/kernel",
    "self_attn.v_proj.weight": "v_proj/kernel",
    "self_attn.o_proj.weight": "o_proj/kernel",
    "post_attention_layernorm.weight": "mlp_norm/scale",
    "mlp.gate_proj.weight": "gate_proj/kernel",
    "mlp.up_proj.weight": "up_proj/kernel",
    "mlp.down_proj.weight": "down_proj/kernel",
}


def hf_llama_names(arch: Arch) -> dict[str, str]:
    """Every HF name -> Keras path (relative to the model) the Llama of ``arch`` has."""
    names = {"model.embed_tokens.weight": "embed_tokens/embeddings",
             "model.norm.weight": "final_norm/scale"}
    if not arch.tied_embeddings:  # lm_head (vocab, hidden) -> (hidden, vocab)
        names["lm_head.weight"] = "embed_tokens/reverse_embeddings"
    for i in range(arch.layers):
        for hf, ours in HF_LLAMA_LAYER.items():
            names[f"model.layers.{i}.{hf}"] = f"layer{i}/{ours}"
    return names


def copy_hf_llama_to_keras(hf_model: torch.nn.Module, keras_model: keras.Model,
                           arch: Arch) -> None:
    """Overwrite every weight of the Keras Llama with the HF model's; fails if a name is
    missing on either side or a shape differs."""
    state = {k: _np(v) for k, v in hf_model.state_dict().items()}
    ours = {v.path.split("/", 1)[1]: v for v in keras_model.weights}
    names = hf_llama_names(arch)
    assert set(ours) == set(names.values()), sorted(set(ours) ^ set(names.values()))
    for hf, path in names.items():
        value = state[hf]
        if hf.endswith("proj.weight") or hf == "lm_head.weight":
            value = value.T
        assert tuple(ours[path].shape) == value.shape, (hf, ours[path].shape, value.shape)
        ours[path].assign(value)
