"""Per-device defaults for ``batch_size: null``, ``steps: null`` and ``warmup_steps: null``.

GPU batches fill a data-centre GPU the way the public benchmarks do (ResNet-50 at 256 images,
BERT at 64 sequences of 128 tokens, ViT at 128 images). CPU batches keep the README's main
command to minutes on a 2-core machine: ViT-B/16 costs ~53 GFLOP per training image.
"""

from __future__ import annotations

from typing import Optional

# device kind -> model -> (per-device batch, timed steps, warm-up steps)
_DEFAULTS = {
    "gpu": {"resnet50": (256, 50, 10), "bert": (64, 50, 10), "vit": (128, 50, 10),
            "vit_large": (64, 50, 10), "bert_large": (32, 50, 10),
            "llama": (8, 50, 10), "llama_8b": (2, 50, 10),
            "custom": (32, 50, 10)},
    "cpu": {"resnet50": (8, 10, 2), "bert": (4, 10, 2), "vit": (4, 10, 2),
            "vit_large": (2, 5, 2), "bert_large": (2, 5, 2),
            "llama": (1, 5, 2), "llama_8b": (1, 5, 2),
            "custom": (8, 10, 2)},
}


def resolve(model: str, device_kind: str, batch_size: Optional[int], steps: Optional[int],
            warmup_steps: Optional[int]) -> tuple[int, int, int]:
    """Fill the ``None`` among (batch_size, steps, warmup_steps) for this model and device kind
    (``warmup_steps=0`` stays 0: the first timed step then gives first_step_time_s)."""
    batch, n, warm = _DEFAULTS["gpu" if device_kind == "gpu" else "cpu"][model]
    return batch_size or batch, steps or n, warm if warmup_steps is None else warmup_steps
