"""ResNet-50 v1.5, ViT and BERT (masked-LM) as Flax NNX modules, sized by ``Arch``.

Layouts are JAX's: images NHWC, conv kernels HWIO, dense kernels (in, out). ``dtype`` is the
compute dtype (bf16 / fp16 for mixed precision); parameters are always created in float32.
Initialisers follow the PyTorch reference (fxtrack.frameworks.torch.models) in distribution,
though not in random values (each framework draws from its own generator).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from fxtrack.architectures import Arch
from fxtrack.frameworks.base import BATCH_NORM_EPS, BATCH_NORM_MOMENTUM, LAYER_NORM_EPS
from fxtrack.frameworks.jax import devices

Dtype = Any

# torch's kaiming_normal_(mode="fan_out", nonlinearity="relu") for the ResNet convolutions.
_conv_init = nnx.initializers.variance_scaling(2.0, "fan_out", "normal")
# torch's default nn.Linear / nn.Conv2d weight: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
_torch_default_init = nnx.initializers.variance_scaling(1 / 3, "fan_in", "uniform")
# _init_transformer's trunc_normal_(std=0.02) (cut at +-2 absolute, i.e. +-100 sigma: a normal).
_normal_init = nnx.initializers.normal(0.02)


def _torch_bias_init(fan_in: int):
    """torch's default bias: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1 / math.sqrt(fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


# ----------------------------------------------------------------------------- ResNet-50 v1.5
def _conv(in_ch: int, out_ch: int, k: int, stride: int, pad: int, dtype: Dtype,
          rngs: nnx.Rngs) -> nnx.Conv:
    """A bias-free k x k convolution with explicit symmetric padding, as torch's
    ``padding=k//2`` (Flax's "SAME" would pad (0, 1) on stride 2)."""
    return nnx.Conv(in_ch, out_ch, (k, k), strides=stride, padding=((pad, pad), (pad, pad)),
                    use_bias=False, kernel_init=_conv_init, dtype=dtype, rngs=rngs)


class DeviceBatchNorm(nnx.BatchNorm):
    """BatchNorm whose training-mode statistics come from each device's shard of the batch, as
    torch DDP and Keras' MirroredStrategy normalise (per-device BN in every framework: the same
    arithmetic, and no all-reduce per BN layer). A jitted step over a sharded batch would
    otherwise reduce over the *global* batch (synchronised BN).

    ``groups`` (= devices in the mesh, set by ``per_device_batch_norm``): the batch axis is read
    as (groups, per-device batch) and each group normalised on its own; with the batch sharded
    over the mesh, group i is device i's shard, so every reduction stays on its device. The
    running statistics move by the mean of the groups' statistics (Keras' mirrored-variable
    MEAN; torch DDP keeps rank 0's). Parameters and state are nnx.BatchNorm's, unchanged."""

    groups: int = 1

    def __call__(self, x, use_running_average=None, *, mask=None):
        running = use_running_average if use_running_average is not None \
            else self.use_running_average
        if self.groups == 1 or running or mask is not None:
            return super().__call__(x, use_running_average, mask=mask)
        g = self.groups
        xg = x.reshape(g, x.shape[0] // g, *x.shape[1:])  # (G, B/G, H, W, C)
        axes = tuple(range(1, xg.ndim - 1))  # per group: every axis but the features'
        xf = xg.astype(jnp.float32)  # statistics in float32, as nnx.BatchNorm computes them
        mean = xf.mean(axes, keepdims=True)  # (G, 1, 1, 1, C)
        var = jnp.square(xf - mean).mean(axes, keepdims=True)  # two-pass, as use_fast_variance=False
        m = self.momentum
        stop = jax.lax.stop_gradient
        self.mean[...] = stop(m * self.mean[...] + (1 - m) * mean.mean(axis=0).reshape(-1))
        self.var[...] = stop(m * self.var[...] + (1 - m) * var.mean(axis=0).reshape(-1))
        y = (xf - mean) * jax.lax.rsqrt(var + self.epsilon)
        y = y * self.scale[...] + self.bias[...]
        return y.reshape(x.shape).astype(self.dtype or x.dtype)


def per_device_batch_norm(model: nnx.Module, groups: int) -> None:
    """Make every BatchNorm of ``model`` normalise per device over ``groups`` devices (before
    ``nnx.split``: ``groups`` is static, part of the graph)."""
    for _, module in nnx.iter_modules(model):
        if isinstance(module, DeviceBatchNorm):
            module.groups = groups


def _bn(ch: int, dtype: Dtype, rngs: nnx.Rngs) -> nnx.BatchNorm:
    """BatchNorm with torch's hyper-parameters: Flax's momentum weighs the old statistics
    (1 - torch's momentum); two-pass variance E[(x - mean)^2] as torch, not E[x^2] - mean^2,
    which cancels badly."""
    return DeviceBatchNorm(ch, momentum=1 - BATCH_NORM_MOMENTUM, epsilon=BATCH_NORM_EPS,
                           use_fast_variance=False, dtype=dtype, rngs=rngs)


class Bottleneck(nnx.Module):
    """1x1 reduce, 3x3 (carries the stride: the "v1.5" change), 1x1 expand x4, residual."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int, *, dtype: Dtype,
                 rngs: nnx.Rngs) -> None:
        out_ch = width * self.expansion
        self.conv1 = _conv(in_ch, width, 1, 1, 0, dtype, rngs)
        self.bn1 = _bn(width, dtype, rngs)
        self.conv2 = _conv(width, width, 3, stride, 1, dtype, rngs)
        self.bn2 = _bn(width, dtype, rngs)
        self.conv3 = _conv(width, out_ch, 1, 1, 0, dtype, rngs)
        self.bn3 = _bn(out_ch, dtype, rngs)
        self.downsample = None  # identity shortcut, or a strided 1x1 projection:
        if stride != 1 or in_ch != out_ch:
            self.downsample = nnx.data(nnx.Sequential(
                _conv(in_ch, out_ch, 1, stride, 0, dtype, rngs), _bn(out_ch, dtype, rngs)))

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, H, W, in) -> (B, H/s, W/s, 4*width)
        identity = x if self.downsample is None else self.downsample(x)
        y = nnx.relu(self.bn1(self.conv1(x)))
        y = nnx.relu(self.bn2(self.conv2(y)))
        return nnx.relu(self.bn3(self.conv3(y)) + identity)


class ResNet(nnx.Module):
    """ResNet-50 v1.5: 7x7 stem, max-pool, four stages of bottlenecks, average pool, linear."""

    def __init__(self, arch: Arch, *, dtype: Dtype, rngs: nnx.Rngs) -> None:
        w = arch.width
        self.conv1 = _conv(3, w, 7, 2, 3, dtype, rngs)
        self.bn1 = _bn(w, dtype, rngs)
        blocks, in_ch = [], w
        for i, n in enumerate(arch.stage_sizes):
            width = w * 2**i
            for b in range(n):
                stride = 2 if b == 0 and i > 0 else 1
                blocks.append(Bottleneck(in_ch, width, stride, dtype=dtype, rngs=rngs))
                in_ch = width * Bottleneck.expansion
        self.blocks = nnx.List(blocks)
        self.fc = nnx.Linear(in_ch, arch.num_classes, kernel_init=_torch_default_init,
                             bias_init=_torch_bias_init(in_ch), dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, H, W, 3) -> (B, classes)
        x = nnx.relu(self.bn1(self.conv1(x)))  # (B, H/2, W/2, 64)
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))  # (B, H/4, W/4, 64)
        for block in self.blocks:
            x = block(x)
        return self.fc(x.mean(axis=(1, 2)))  # global average pool: (B, 2048) -> (B, classes)


# ----------------------------------------------------------------------------- transformers
def _dense(d_in: int, d_out: int, dtype: Dtype, rngs: nnx.Rngs) -> nnx.Linear:
    """A transformer Linear: N(0, 0.02) kernel, zero bias (as _init_transformer in torch)."""
    return nnx.Linear(d_in, d_out, kernel_init=_normal_init, dtype=dtype, rngs=rngs)


class SelfAttention(nnx.Module):
    """Multi-head self-attention through ``jax.nn.dot_product_attention``: cuDNN's fused (flash)
    attention on a GPU with bf16 / fp16 where it accepts the shape, XLA's composite elsewhere
    (``devices.attention_implementation``, which also tags the run)."""

    def __init__(self, hidden: int, heads: int, *, dtype: Dtype, rngs: nnx.Rngs) -> None:
        self.heads = heads
        self.qkv = _dense(hidden, 3 * hidden, dtype, rngs)  # q, k, v projections fused
        self.proj = _dense(hidden, hidden, dtype, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, T, C) -> (B, T, C)
        b, t, c = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, c // self.heads)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # each (B, T, heads, head_dim)
        if x.dtype == jnp.float16 and jax.default_backend() == "cpu":
            # XLA:CPU has no fp16 x fp16 -> fp32 dot (the scores' accumulation): use fp32 there.
            q, k, v = (a.astype(jnp.float32) for a in (q, k, v))
        impl = devices.attention_implementation(q.shape, q.dtype)
        y = jax.nn.dot_product_attention(q, k, v, implementation=impl).astype(x.dtype)
        # y: (B, T, heads, head_dim)
        return self.proj(y.reshape(b, t, c))


class Mlp(nnx.Module):
    """hidden -> mlp_dim -> GELU -> hidden."""

    def __init__(self, hidden: int, mlp_dim: int, *, dtype: Dtype, rngs: nnx.Rngs) -> None:
        self.fc1 = _dense(hidden, mlp_dim, dtype, rngs)
        self.fc2 = _dense(mlp_dim, hidden, dtype, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(nnx.gelu(self.fc1(x), approximate=False))  # exact (erf) GELU as torch


class Block(nnx.Module):
    """A transformer encoder block: pre-LN (ViT) or post-LN (BERT)."""

    def __init__(self, arch: Arch, pre_norm: bool, *, dtype: Dtype, rngs: nnx.Rngs) -> None:
        h, eps = arch.hidden, LAYER_NORM_EPS[arch.family]
        self.pre_norm = pre_norm
        self.norm1 = nnx.LayerNorm(h, epsilon=eps, dtype=dtype, rngs=rngs)
        self.attn = SelfAttention(h, arch.heads, dtype=dtype, rngs=rngs)
        self.norm2 = nnx.LayerNorm(h, epsilon=eps, dtype=dtype, rngs=rngs)
        self.mlp = Mlp(h, arch.mlp_dim, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, T, C) -> (B, T, C)
        if self.pre_norm:
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.mlp(x))


class ViT(nnx.Module):
    """ViT: patch embedding, class token, learned positions, pre-LN blocks, final LN, head."""

    def __init__(self, arch: Arch, *, dtype: Dtype, rngs: nnx.Rngs) -> None:
        h, p = arch.hidden, arch.patch
        tokens = (arch.image_size // p) ** 2 + 1  # patches + class token
        fan_in = 3 * p * p
        self.patch_embed = nnx.Conv(3, h, (p, p), strides=p, padding="VALID",
                                    kernel_init=_torch_default_init,
                                    bias_init=_torch_bias_init(fan_in), dtype=dtype, rngs=rngs)
        self.cls_token = nnx.Param(jnp.zeros((1, 1, h)))
        self.pos_embed = nnx.Param(_normal_init(rngs.params(), (1, tokens, h)))
        self.blocks = nnx.List(Block(arch, True, dtype=dtype, rngs=rngs)
                               for _ in range(arch.layers))
        self.norm = nnx.LayerNorm(h, epsilon=LAYER_NORM_EPS["vit"], dtype=dtype, rngs=rngs)
        self.head = _dense(h, arch.num_classes, dtype, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, H, W, 3) -> (B, classes)
        x = self.patch_embed(x)  # (B, H/p, W/p, hidden)
        b, gh, gw, h = x.shape
        x = x.reshape(b, gh * gw, h)  # (B, patches, hidden), row-major as torch's flatten(2)
        cls = jnp.broadcast_to(self.cls_token[...].astype(x.dtype), (b, 1, h))
        x = jnp.concatenate([cls, x], axis=1) + self.pos_embed[...].astype(x.dtype)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


class Bert(nnx.Module):
    """BERT encoder with the masked-LM head; the decoder reuses the word-embedding matrix."""

    def __init__(self, arch: Arch, *, dtype: Dtype, rngs: nnx.Rngs) -> None:
        h, eps = arch.hidden, LAYER_NORM_EPS["bert"]
        def embed(rows: int) -> nnx.Embed:
            return nnx.Embed(rows, h, embedding_init=_normal_init, dtype=dtype, rngs=rngs)

        self.word_embeddings = embed(arch.vocab_size)  # (vocab, hidden), also the MLM decoder
        self.position_embeddings = embed(arch.max_position)
        self.token_type_embeddings = embed(arch.type_vocab)
        self.embed_norm = nnx.LayerNorm(h, epsilon=eps, dtype=dtype, rngs=rngs)
        self.blocks = nnx.List(Block(arch, False, dtype=dtype, rngs=rngs)
                               for _ in range(arch.layers))
        self.mlm_dense = _dense(h, h, dtype, rngs)
        self.mlm_norm = nnx.LayerNorm(h, epsilon=eps, dtype=dtype, rngs=rngs)
        self.mlm_bias = nnx.Param(jnp.zeros((arch.vocab_size,)))

    def __call__(self, ids: jax.Array) -> jax.Array:  # (B, T) int -> (B, T, vocab)
        t = ids.shape[1]
        x = self.word_embeddings(ids)  # (B, T, hidden)
        x = (x + self.position_embeddings.embedding[:t].astype(x.dtype)
             + self.token_type_embeddings.embedding[0].astype(x.dtype))  # one segment: type 0
        x = self.embed_norm(x)
        for block in self.blocks:
            x = block(x)
        x = self.mlm_norm(nnx.gelu(self.mlm_dense(x), approximate=False))
        logits = self.word_embeddings.attend(x)  # tied decoder: (B, T, hidden) @ (hidden, vocab)
        return logits + self.mlm_bias[...].astype(logits.dtype)


_REMAT: dict[type, type] = {}  # block class -> its rematerialised subclass, made once


def checkpoint_blocks(model: nnx.Module) -> None:
    """memory=checkpoint: each transformer block / ResNet bottleneck becomes a subclass whose
    ``__call__`` is ``nnx.remat``'d (``jax.checkpoint``): the backward pass recomputes the
    block's activations from its input instead of keeping them. Same math; BatchNorm's
    statistics update is carried out of the remat as any nnx state."""
    for block in model.blocks:
        cls = type(block)
        if cls not in _REMAT:
            _REMAT[cls] = type(f"Remat{cls.__name__}", (cls,), {"__call__": nnx.remat(cls.__call__)})
        block.__class__ = _REMAT[cls]


def build(arch: Arch, dtype: Dtype = jnp.float32, rngs: nnx.Rngs | None = None) -> nnx.Module:
    """The Flax model for ``arch`` with ``dtype`` compute and float32 parameters."""
    cls = {"resnet": ResNet, "vit": ViT, "bert": Bert}[arch.family]
    return cls(arch, dtype=dtype, rngs=rngs or nnx.Rngs(0))
