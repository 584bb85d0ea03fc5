"""Test tooling: Hugging Face's ``LlamaForCausalLM`` as the outside reference for fxtrack's Llama
in every framework. ``hf_reference`` builds it from a local ``LlamaConfig`` with an fxtrack
architecture's dims (no download); ``hf_state_numpy`` gives its weights as NumPy arrays under
Hugging Face's names, which each framework's parity test copies into its own model (torch:
``to_torch`` below). Linear weights stay in torch's (out, in) layout; the tied output projection
appears once, as the embedding.
"""

from __future__ import annotations

import re

import numpy as np

from fxtrack.architectures import Arch

# Hugging Face name -> fxtrack torch name (fxtrack/frameworks/torch/models.py:Llama).
HF_TO_TORCH = [
    (r"^model\.embed_tokens\.", "embed_tokens."),
    (r"^model\.layers\.(\d+)\.self_attn\.", r"blocks.\1.attn."),
    (r"^model\.layers\.(\d+)\.mlp\.", r"blocks.\1.mlp."),
    (r"^model\.layers\.(\d+)\.input_layernorm\.", r"blocks.\1.attn_norm."),
    (r"^model\.layers\.(\d+)\.post_attention_layernorm\.", r"blocks.\1.mlp_norm."),
    (r"^model\.norm\.", "norm."),
    (r"^lm_head\.", "lm_head."),
]


def hf_config(arch: Arch):
    """A ``LlamaConfig`` with ``arch``'s dims: no biases, eager attention (the plain reference),
    and no special tokens, so greedy ``generate`` never stops early on an EOS id."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=arch.vocab_size, hidden_size=arch.hidden, intermediate_size=arch.mlp_dim,
        num_hidden_layers=arch.layers, num_attention_heads=arch.heads,
        num_key_value_heads=arch.kv_heads, head_dim=arch.hidden // arch.heads,
        max_position_embeddings=max(arch.seq_len, 512), rms_norm_eps=arch.norm_eps,
        rope_theta=arch.rope_theta, tie_word_embeddings=arch.tied_embeddings,
        attention_bias=False, mlp_bias=False, hidden_act="silu", initializer_range=0.02,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="eager")


def hf_reference(arch: Arch, seed: int = 0, std: float = 0.02, norm_std: float = 0.0):
    """Hugging Face's ``LlamaForCausalLM`` at ``arch``'s dims, its own init from ``seed`` (normal
    with ``std``), fp32, eval mode. At the tiny size and fxtrack's std 0.02 greedy decoding just
    repeats the prompt's last token (the tied embedding dominates the logits), which would make a
    generation parity test vacuous; std 0.2 gives tokens that depend on the whole context.
    ``norm_std`` > 0 draws the RMSNorm weights from N(1, norm_std) instead of 1, so a norm weight
    copied to the wrong place shows in the logits."""
    import torch
    from transformers import LlamaForCausalLM

    config = hf_config(arch)
    config.initializer_range = std
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float().eval()
    if norm_std:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.normal_(1.0, norm_std)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def hf_state_numpy(model) -> dict[str, np.ndarray]:
    """The reference's weights, Hugging Face's names -> float32 arrays ((out, in) for linears);
    ``lm_head.weight`` only when untied (tied, it is ``model.embed_tokens.weight``)."""
    tied = model.config.tie_word_embeddings
    return {name: t.detach().float().cpu().numpy().copy()
            for name, t in model.state_dict().items()
            if not (tied and name == "lm_head.weight")}


def torch_name(hf_name: str) -> str:
    for pattern, repl in HF_TO_TORCH:
        if re.match(pattern, hf_name):
            return re.sub(pattern, repl, hf_name)
    raise KeyError(f"no fxtrack torch name for Hugging Face's {hf_name!r}")


def to_torch(state: dict[str, np.ndarray], model) -> None:
    """Copy ``hf_state_numpy``'s arrays into fxtrack's torch Llama; every parameter is written
    exactly once (a missing or extra name is an error, not a silent partial copy)."""
    import torch

    mapped = {torch_name(k): torch.from_numpy(v) for k, v in state.items()}
    params = dict(model.named_parameters())
    missing, extra = set(params) - set(mapped), set(mapped) - set(params)
    if missing or extra:
        raise KeyError(f"weights missing {sorted(missing)}, unexpected {sorted(extra)}")
    with torch.no_grad():
        for name, value in mapped.items():
            params[name].copy_(value)
