"""scenario=converge's defaults beside the families: per dataset, the held-out metric, the
target, the budget and the model dims of the reference runs that set them (docs/converge.md
names the runs). A target is one the reference run reached on a 2-core CPU in a minute or
two at those dims; a run at other dims may need another (``scenario.target``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional


@dataclasses.dataclass(frozen=True)
class Quality:
    metric: str  # accuracy | loss | bits_per_byte
    target: float
    max_epochs: int
    max_steps: Optional[int]  # a cap on the budget's steps too (None: the epochs alone)
    eval_every: int  # optimiser steps between evaluations
    batch_size: int
    lr: float  # AdamW's peak rate (warm-up then cosine)
    dims: dict[str, Any]  # the reference runs' model.<key> (a "size" that says so)
    reference: str  # the docs section with the runs that set the target


_REF = "docs/converge.md#reference-runs-2026-12-04"
# ViT at 2 layers, hidden 64 on MNIST's 28-pixel digits cut in 7-pixel patches (16 patches)
_REF_1D = "docs/converge.md#the-vit-on-mnist-1d-2026-12-04"
_REF_BERT = "docs/converge.md#bert-on-the-standard-librarys-bytes-2026-12-05"
VIT = {"mnist": Quality("accuracy", 0.8, 5, None, 20, 64, 3e-3,
                        dict(layers=2, hidden=64, heads=4, mlp_dim=128, patch=7), _REF),
       # the same ViT on MNIST-1D's 40-sample signals, one-row images cut in (1 x 4) patches
       # (10 patches): 20 epochs of 62 steps, evaluated once an epoch
       "mnist1d": Quality("accuracy", 0.7, 20, None, 62, 64, 3e-3,
                          dict(layers=2, hidden=64, heads=4, mlp_dim=128, patch=4), _REF_1D)}
# Llama at 2 layers, hidden 64 on stdlib bytes, 64-byte windows, 600 steps of 32 windows
LLAMA = {"pycode": Quality("bits_per_byte", 3.0, 1, 600, 50, 32, 3e-3,
                           dict(layers=2, hidden=64, heads=4, kv_heads=2, mlp_dim=128,
                                seq_len=64), _REF)}
# BERT at the Llama's dims on the same bytes, 64-byte windows masked as its synthetic batches
# are (15%), scored on the masked bytes only: one epoch of 1,714 steps of 32 windows (the
# held-out figure sits near the bytes' unigram entropy, ~4.5 bits, for the first ~600 steps
# until attention reads the neighbours)
BERT = {"pycode": Quality("bits_per_byte", 4.0, 1, None, 100, 32, 3e-3,
                          dict(layers=2, hidden=64, heads=4, mlp_dim=128, seq_len=64), _REF_BERT)}
