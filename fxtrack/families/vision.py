"""The image classifiers: ResNet (He et al. 2015) and ViT (Dosovitskiy et al. 2020).

Their canonical sizes follow the papers and the public reference implementations whose trainable
parameter counts docs/contract.md#groups fixes:

- ResNet-50 v1.5 (stride 2 on the 3x3 conv of each down-sampling bottleneck as in torchvision):
  25,557,032 parameters with 1000 classes.
- ViT-B/16 and ViT-L/16 (class token, learned position embeddings, final LayerNorm, linear head,
  as timm's ``vit_*_patch16_224``): 86,567,656 / 304,326,632.

``size=tiny`` keeps widths and shrinks depth and input: the ViTs get 2 layers and 32-pixel
images, ResNet-50 keeps its depth and gets 32-pixel images. Per-device defaults: GPU batches
fill a data-centre GPU the way the public benchmarks do (ResNet-50 at 256 images, ViT at 128);
CPU batches keep the README's main command to minutes on a 2-core machine (ViT-B/16 costs ~53
GFLOP per training image).

Their synthetic batch: a per-class prototype plus noise (the class is learnable from the pixels),
NHWC (PyTorch permutes). FLOPs count matrix multiplies and convolutions only (fxtrack.flops).

Images are square, ``image_size`` a side, except where real data sets the ViT's
``image_height`` (a dim only data sets, absent from the table: ``Family.data_keys``): 1-D
signals (MNIST-1D's 40 samples) are one-row images, (1 x image_size), cut into (1 x patch)
patches. ``image_hw``, ``patch_hw`` and ``patch_grid`` are the one reading of these dims every
framework's ViT, the FLOP count and the attention's token count share.
"""

from __future__ import annotations

from typing import Any

from fxtrack.families import quality
from fxtrack.families.spec import Family, Model, sgd_lr

Arch = Any  # fxtrack.architectures.Arch, which imports this package


def conv_flops(c_in: int, c_out: int, k: int, out_hw: int) -> int:
    return 2 * c_in * c_out * k * k * out_hw * out_hw


def encoder_layer_flops(tokens: int, hidden: int, mlp_dim: int) -> int:
    """One transformer block: q/k/v + output projections, QK^T and AV, the two MLP matmuls."""
    projections = 2 * tokens * hidden * 4 * hidden
    attention = 2 * 2 * tokens * tokens * hidden
    mlp = 2 * 2 * tokens * hidden * mlp_dim
    return projections + attention + mlp


def _dims(arch: Any) -> dict[str, Any]:
    return arch["dims"] if isinstance(arch, dict) else arch.dims  # an Arch or its JSON form


def image_hw(arch: Any) -> tuple[int, int]:
    """(height, width) of the model's input: ``image_height`` where data set it, else square."""
    d = _dims(arch)
    return int(d.get("image_height", d["image_size"])), int(d["image_size"])


def patch_hw(arch: Any) -> tuple[int, int]:
    """The ViT's patch, (rows, columns): ``patch`` square, no taller than the image (a one-row
    image's patches are one row high)."""
    d = _dims(arch)
    return min(int(d["patch"]), image_hw(arch)[0]), int(d["patch"])


def patch_grid(arch: Any) -> tuple[int, int]:
    """Patches down and across the image: the ViT's tokens are their product + the class token."""
    (h, w), (ph, pw) = image_hw(arch), patch_hw(arch)
    return h // ph, w // pw


def vit_tokens(arch: Any) -> int:
    """The ViT's tokens: its patches and the class token."""
    rows, columns = patch_grid(arch)
    return rows * columns + 1


def image_batch(rng: Any, arch: "Arch", batch_size: int) -> dict[str, Any]:
    """``images`` (B, H, W, 3) float32 + ``labels`` (B,) int32."""
    import numpy as np

    (h, w), c = image_hw(arch), arch.num_classes
    labels = rng.integers(0, c, size=batch_size)
    prototypes = rng.standard_normal((c, 1, 1, 3)).astype(np.float32)
    noise = rng.standard_normal((batch_size, h, w, 3)).astype(np.float32)
    return {"images": prototypes[labels] + noise, "labels": labels.astype(np.int32)}


def image_shapes(arch: "Arch", batch_size: int) -> dict[str, dict[str, Any]]:
    h, w = image_hw(arch)
    return {"images": {"shape": [batch_size, h, w, 3], "dtype": "float32"},
            "labels": {"shape": [batch_size], "dtype": "int32"}}


def _resnet_flops(a: "Arch") -> int:
    hw = a.image_size // 2  # after the stride-2 7x7 stem
    flops = conv_flops(3, a.width, 7, hw)
    hw = (hw + 1) // 2  # 3x3 max pool, stride 2
    in_ch = a.width
    for i, blocks in enumerate(a.stage_sizes):
        width = a.width * 2**i
        for b in range(blocks):
            stride = 2 if b == 0 and i > 0 else 1
            out_hw = (hw + stride - 1) // stride
            flops += conv_flops(in_ch, width, 1, hw) + conv_flops(width, width, 3, out_hw)
            flops += conv_flops(width, 4 * width, 1, out_hw)
            if b == 0:  # projection shortcut
                flops += conv_flops(in_ch, 4 * width, 1, out_hw)
            in_ch, hw = 4 * width, out_hw
    return flops + 2 * in_ch * a.num_classes


def _vit_flops(a: "Arch") -> int:
    (gh, gw), (ph, pw) = patch_grid(a), patch_hw(a)
    tokens = gh * gw + 1
    flops = 2 * 3 * a.hidden * ph * pw * gh * gw  # the patch embedding (conv_flops if square)
    flops += a.layers * encoder_layer_flops(tokens, a.hidden, a.mlp_dim)
    return flops + 2 * a.hidden * a.num_classes  # the head reads the class token only


def check_heads(d: dict[str, Any]) -> None:
    if d["hidden"] % d["heads"]:
        raise ValueError(f"model.hidden ({d['hidden']}) must be divisible by model.heads ({d['heads']})")


def _check_resnet(name: str, d: dict[str, Any]) -> None:
    if d["image_size"] < 32:
        raise ValueError(f"model.image_size must be at least 32 for {name} (it down-samples 32x)")


def _check_vit(name: str, d: dict[str, Any]) -> None:
    check_heads(d)
    if d["image_size"] % d["patch"]:
        raise ValueError(f"model.image_size ({d['image_size']}) must be divisible by model.patch ({d['patch']})")
    height = d.get("image_height", d["image_size"])
    if height % min(d["patch"], height):
        raise ValueError(f"the image's height ({height}) must be divisible by model.patch "
                         f"({d['patch']})")


def image_dims(split: Any) -> dict[str, Any]:
    """Real data sets the input size and the classes. Grey images are fed as three equal
    channels (the models' stems take RGB), which the data's batches do; 1-D signals of length
    L as one-row images (1 x L), which the batches give as (B, 1, L, 3) and the ViT cuts into
    (1 x patch) patches."""
    if split.kind == "signals":
        return {"image_height": 1, "image_size": int(split.shape[0]),
                "num_classes": int(split.classes)}
    if split.kind != "images":
        raise ValueError(f"data={split.name} holds {split.kind} of shape {split.shape}; the "
                         "ViT takes square images (N, H, W[, C]) or 1-D signals (N, L)")
    return {"image_size": int(split.shape[0]), "num_classes": int(split.classes)}


def _sgd(arch: "Arch", global_batch: int) -> tuple[str, float]:
    return "sgd", sgd_lr(global_batch)


RESNET50 = Model("resnet50", dict(image_size=224, num_classes=1000, stage_sizes=(3, 4, 6, 3),
                                  width=64),
                  gpu=(256, 50, 10), cpu=(8, 10, 2), tiny=dict(image_size=32),
                  params=25_557_032, display="ResNet-50")
_VIT_TINY = dict(layers=2, image_size=32)
VIT_B16 = Model("vit", dict(image_size=224, patch=16, layers=12, hidden=768, heads=12,
                            mlp_dim=3072, num_classes=1000),
                gpu=(128, 50, 10), cpu=(4, 10, 2), tiny=_VIT_TINY, params=86_567_656,
                display="ViT-B/16")
VIT_L16 = Model("vit_large", dict(image_size=224, patch=16, layers=24, hidden=1024, heads=16,
                                  mlp_dim=4096, num_classes=1000),
                gpu=(64, 50, 10), cpu=(2, 5, 2), tiny=_VIT_TINY, params=304_326_632,
                display="ViT-L/16")

RESNET = Family("resnet", size_keys=("image_size", "num_classes", "width"), check=_check_resnet,
                batch=image_batch, describe=image_shapes, forward_flops=_resnet_flops,
                dataset="jpeg", optimizer=_sgd, models=(RESNET50,))
VIT = Family("vit", size_keys=("image_size", "num_classes", "patch", "layers", "hidden", "heads",
                               "mlp_dim"),
             check=_check_vit, batch=image_batch, describe=image_shapes, forward_flops=_vit_flops,
             dataset="jpeg", data_dims=image_dims, data_keys=("image_height",),
             quality=quality.VIT, attention_tokens=vit_tokens, models=(VIT_B16, VIT_L16))
