"""Model FLOPs per sample from the architecture table (multiply-add = 2 FLOPs).

Only matrix multiplies and convolutions are counted, as in the MFU convention of PaLM
(Chowdhery et al. 2022, appendix B) and nanoGPT's ``estimate_mfu``: norms, activations and
the optimiser are a few percent at most. Training is 3x forward (backward ~= 2x forward).
The tests cross-check these numbers against torch's FlopCounterMode and JAX's cost_analysis().
"""

from __future__ import annotations

from fxtrack.architectures import Arch, llama_params


def _conv(c_in: int, c_out: int, k: int, out_hw: int) -> int:
    return 2 * c_in * c_out * k * k * out_hw * out_hw


def _encoder_layer(tokens: int, hidden: int, mlp_dim: int) -> int:
    """One transformer block: q/k/v + output projections, QK^T and AV, the two MLP matmuls."""
    projections = 2 * tokens * hidden * 4 * hidden
    attention = 2 * 2 * tokens * tokens * hidden
    mlp = 2 * 2 * tokens * hidden * mlp_dim
    return projections + attention + mlp


def _resnet(a: Arch) -> int:
    hw = a.image_size // 2  # after the stride-2 7x7 stem
    flops = _conv(3, a.width, 7, hw)
    hw = (hw + 1) // 2  # 3x3 max pool, stride 2
    in_ch = a.width
    for i, blocks in enumerate(a.stage_sizes):
        width = a.width * 2**i
        for b in range(blocks):
            stride = 2 if b == 0 and i > 0 else 1
            out_hw = (hw + stride - 1) // stride
            flops += _conv(in_ch, width, 1, hw) + _conv(width, width, 3, out_hw)
            flops += _conv(width, 4 * width, 1, out_hw)
            if b == 0:  # projection shortcut
                flops += _conv(in_ch, 4 * width, 1, out_hw)
            in_ch, hw = 4 * width, out_hw
    return flops + 2 * in_ch * a.num_classes


def _vit(a: Arch) -> int:
    patches_per_side = a.image_size // a.patch
    tokens = patches_per_side**2 + 1
    flops = _conv(3, a.hidden, a.patch, patches_per_side)
    flops += a.layers * _encoder_layer(tokens, a.hidden, a.mlp_dim)
    return flops + 2 * a.hidden * a.num_classes  # the head reads the class token only


def _bert(a: Arch) -> int:
    t = a.seq_len
    flops = a.layers * _encoder_layer(t, a.hidden, a.mlp_dim)
    return flops + 2 * t * a.hidden * a.hidden + 2 * t * a.hidden * a.vocab_size  # MLM head


def _llama(a: Arch) -> int:
    """Per sequence of seq_len tokens, PaLM's convention (as MaxText and torchtitan report MFU):
    2 x N_matmul x T for the weights, plus 4 x layers x hidden x T^2 for QK^T and AV counted
    over the full T x T square (causal masking is not discounted). Training: 3x, i.e.
    6 N T + 12 L H T^2."""
    t = a.seq_len
    return 2 * llama_params(a)["matmul"] * t + 4 * a.layers * a.hidden * t * t


def forward_flops_per_sample(arch: Arch) -> int:
    return {"resnet": _resnet, "vit": _vit, "bert": _bert, "llama": _llama}[arch.family](arch)


def train_flops_per_sample(arch: Arch) -> int:
    return 3 * forward_flops_per_sample(arch)


def generate_flops_per_sample(arch: Arch, prompt_len: int, new_tokens: int) -> int:
    """One generated sequence (scenario=generate): the prompt's prefill (the forward above at
    ``prompt_len`` tokens), then ``new_tokens - 1`` single-token steps through the cache, each
    2 x N_matmul plus QK^T and AV against the positions cached so far."""
    a, p = arch, prompt_len
    if a.family != "llama":
        raise ValueError(f"scenario=generate has no FLOP count for model family {a.family!r}")
    per_token = 2 * llama_params(a)["matmul"]
    prefill = per_token * p + 4 * a.layers * a.hidden * p * p
    cached = sum(range(p + 1, p + new_tokens))  # keys each decode step attends to
    return prefill + per_token * (new_tokens - 1) + 4 * a.layers * a.hidden * cached
