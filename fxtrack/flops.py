"""Model FLOPs per sample from the model's dims (multiply-add = 2 FLOPs).

Only matrix multiplies and convolutions are counted, as in the MFU convention of PaLM
(Chowdhery et al. 2022, appendix B) and nanoGPT's ``estimate_mfu``: norms, activations and
the optimiser are a few percent at most. Training is 3x forward (backward ~= 2x forward).
Each family's formula is its spec's (``fxtrack.families``). The tests cross-check these numbers against torch's FlopCounterMode and JAX's cost_analysis().
"""

from __future__ import annotations

from fxtrack import families
from fxtrack.architectures import Arch


def forward_flops_per_sample(arch: Arch) -> int:
    """One forward pass of one sample, its family's formula (``Family.forward_flops``)."""
    formula = families.of(arch).forward_flops
    if formula is None:
        raise ValueError(f"model family {arch.family!r} has no FLOP formula (its framework "
                         "counts them)")
    return formula(arch)


def train_flops_per_sample(arch: Arch) -> int:
    return 3 * forward_flops_per_sample(arch)


def generate_flops_per_sample(arch: Arch, prompt_len: int, new_tokens: int) -> int:
    """One generated sequence (scenario=generate): the prompt's prefill, then ``new_tokens - 1``
    single-token steps through the KV cache (``Family.generate_flops``)."""
    formula = families.of(arch).generate_flops
    if formula is None:
        raise ValueError(f"scenario=generate has no FLOP count for model family {arch.family!r}")
    return formula(arch, prompt_len, new_tokens)
