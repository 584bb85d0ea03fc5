"""ResNet-50 v1.5, ViT, BERT (masked-LM) and a Llama decoder as Flax NNX modules, sized by ``Arch``.

Layouts are JAX's: images NHWC, conv kernels HWIO, dense kernels (in, out). ``dtype`` is the
compute dtype (bf16 / fp16 for mixed precision); parameters are always created in float32.
Initialisers follow the PyTorch reference (fxtrack.frameworks.torch.models) in distribution,
though not in random values (each framework draws from its own generator).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from fxtrack.architectures import Arch
from fxtrack.frameworks.base import (BATCH_NORM_EPS, BATCH_NORM_MOMENTUM, BERT_LAYER_NORM_EPS,
                                     VIT_LAYER_NORM_EPS, Builder, patch_grid, patch_hw)
from fxtrack.frameworks import xla_bf16 as matmul
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
def _pointwise_conv(x: jax.Array, kernel: jax.Array, strides: Any, padding: Any,
                    **kwargs: Any) -> jax.Array:
    """``nnx.Conv``'s convolution for an unpadded 1x1 kernel: the product it is
    (``matmul.pointwise_conv``) where ``matmul.conv_form`` says, else XLA's convolution."""
    if not matmul.conv_form(jax.default_backend())[0]:
        return lax.conv_general_dilated(x, kernel, strides, padding, **kwargs)
    return matmul.pointwise_conv(x, kernel, strides)


def _conv(in_ch: int, out_ch: int, k: int, stride: int, pad: int, dtype: Dtype,
          rngs: nnx.Rngs) -> nnx.Conv:
    """A bias-free k x k convolution with explicit symmetric padding, as torch's
    ``padding=k//2`` (Flax's "SAME" would pad (0, 1) on stride 2); a 1x1 one as its product
    (``_pointwise_conv``), with the same kernel."""
    conv = _pointwise_conv if k == 1 and pad == 0 else lax.conv_general_dilated
    return nnx.Conv(in_ch, out_ch, (k, k), strides=stride, padding=((pad, pad), (pad, pad)),
                    use_bias=False, kernel_init=_conv_init, dtype=dtype, rngs=rngs,
                    conv_general_dilated=conv)


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
                             bias_init=_torch_bias_init(in_ch), dtype=dtype,
                             dot_general=matmul.dot_general, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, H, W, 3) -> (B, classes)
        x = nnx.relu(self.bn1(self.conv1(x)))  # (B, H/2, W/2, 64)
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))  # (B, H/4, W/4, 64)
        for block in self.blocks:
            x = block(x)
        return self.fc(x.mean(axis=(1, 2)))  # global average pool: (B, 2048) -> (B, classes)


# ----------------------------------------------------------------------------- transformers
def _dense(d_in: int, d_out: int, dtype: Dtype, rngs: nnx.Rngs) -> nnx.Linear:
    """A transformer Linear: N(0, 0.02) kernel, zero bias (as _init_transformer in torch)."""
    return nnx.Linear(d_in, d_out, kernel_init=_normal_init, dtype=dtype,
                      dot_general=matmul.dot_general, rngs=rngs)


def _attend(embed: nnx.Embed, x: jax.Array) -> jax.Array:
    """A tied output projection: x (..., hidden) @ the embedding (vocab, hidden) transposed, in
    the compute dtype (as ``nnx.Embed.attend``), through ``matmul``'s bf16-kernel form."""
    dtype = embed.dtype or x.dtype
    return matmul.matmul(x.astype(dtype), embed.embedding[...].astype(dtype), w_transposed=True)


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
        with jax.named_scope("attention"):  # a name only: the profile capability's split
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

    def __init__(self, arch: Arch, pre_norm: bool, eps: float, *, dtype: Dtype,
                 rngs: nnx.Rngs) -> None:
        h = arch.hidden
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
        h, p = arch.hidden, patch_hw(arch)
        rows, columns = patch_grid(arch)
        tokens = rows * columns + 1  # patches + class token
        fan_in = 3 * p[0] * p[1]
        self.patch_embed = nnx.Conv(3, h, p, strides=p, padding="VALID",
                                    kernel_init=_torch_default_init,
                                    bias_init=_torch_bias_init(fan_in), dtype=dtype, rngs=rngs)
        self.cls_token = nnx.Param(jnp.zeros((1, 1, h)))
        self.pos_embed = nnx.Param(_normal_init(rngs.params(), (1, tokens, h)))
        self.blocks = nnx.List(Block(arch, True, VIT_LAYER_NORM_EPS, dtype=dtype, rngs=rngs)
                               for _ in range(arch.layers))
        self.norm = nnx.LayerNorm(h, epsilon=VIT_LAYER_NORM_EPS, dtype=dtype, rngs=rngs)
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
        h, eps = arch.hidden, BERT_LAYER_NORM_EPS
        def embed(rows: int) -> nnx.Embed:
            return nnx.Embed(rows, h, embedding_init=_normal_init, dtype=dtype, rngs=rngs)

        self.word_embeddings = embed(arch.vocab_size)  # (vocab, hidden), also the MLM decoder
        self.position_embeddings = embed(arch.max_position)
        self.token_type_embeddings = embed(arch.type_vocab)
        self.embed_norm = nnx.LayerNorm(h, epsilon=eps, dtype=dtype, rngs=rngs)
        self.blocks = nnx.List(Block(arch, False, eps, dtype=dtype, rngs=rngs)
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
        logits = _attend(self.word_embeddings, x)  # tied decoder: (B, T, hidden) @ (hidden, vocab)
        return logits + self.mlm_bias[...].astype(logits.dtype)


# ----------------------------------------------------------------------------- Llama decoder
def rope(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos and sin (T, head_dim), float32, of the rotary angles at ``positions`` (T,) (or
    (B, T, head_dim) at (B, T): a position per row): channel i and i + head_dim/2 share the
    frequency theta^(-2i/head_dim) (Hugging Face's rotate-half)."""
    inv_freq = theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # (..., T, head_dim/2)
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x (B, T, heads, head_dim) rotated: x cos + rotate_half(x) sin."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    if cos.ndim == 2:  # one position per step, shared by the rows
        cos, sin = cos[None], sin[None]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    return (x * cos + rotated * sin).astype(x.dtype)


def _linear(d_in: int, d_out: int, dtype: Dtype, rngs: nnx.Rngs) -> nnx.Linear:
    """A Llama projection: N(0, 0.02), no bias."""
    return nnx.Linear(d_in, d_out, use_bias=False, kernel_init=_normal_init, dtype=dtype,
                      dot_general=matmul.dot_general, rngs=rngs)


def _rms_norm(hidden: int, eps: float, rngs: nnx.Rngs) -> nnx.RMSNorm:
    """RMSNorm computed (and returned) in float32 whatever the compute dtype, as Llama's
    reference does; the next projection casts to the compute dtype."""
    return nnx.RMSNorm(hidden, epsilon=eps, dtype=jnp.float32, rngs=rngs)


# A layer's decoding cache: keys and values (B, positions, kv_heads, head_dim), JAX's layout.
KV = tuple[jax.Array, jax.Array]


class LlamaAttention(nnx.Module):
    """Grouped-query causal self-attention with RoPE through ``jax.nn.dot_product_attention``
    (K and V keep their ``kv_heads`` heads: it groups the query heads itself)."""

    def __init__(self, arch: Arch, *, dtype: Dtype, rngs: nnx.Rngs) -> None:
        h, self.heads, self.kv_heads = arch.hidden, arch.heads, arch.kv_heads
        self.head_dim = h // arch.heads
        self.q_proj = _linear(h, self.heads * self.head_dim, dtype, rngs)
        self.k_proj = _linear(h, self.kv_heads * self.head_dim, dtype, rngs)
        self.v_proj = _linear(h, self.kv_heads * self.head_dim, dtype, rngs)
        self.o_proj = _linear(self.heads * self.head_dim, h, dtype, rngs)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array,
                 cache: KV | None = None, pos: jax.Array | None = None
                 ) -> tuple[jax.Array, KV | None]:
        """(B, T, C) -> (B, T, C), and the cache with this call's keys and values written at
        ``pos``. Without ``pos`` (training, prefill from position 0) the T positions attend
        causally among themselves; with it (one decode step, T = 1) the query attends to the
        cache's first pos + 1 positions, a traced bound: one compiled step for every position."""
        b, t, _ = x.shape
        q = apply_rope(self.q_proj(x).reshape(b, t, self.heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).reshape(b, t, self.kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).reshape(b, t, self.kv_heads, self.head_dim)
        if cache is not None and pos is not None and pos.ndim == 1:  # a position per row
            def write(c: jax.Array, new: jax.Array, at: jax.Array) -> jax.Array:
                return jax.lax.dynamic_update_slice(c, new, (at, 0, 0))

            cache = tuple(jax.vmap(write)(c, new.astype(c.dtype), pos)
                          for c, new in zip(cache, (k, v)))
        elif cache is not None:  # written in place when the caller donates the cache
            at = (0, 0 if pos is None else pos, 0, 0)
            cache = tuple(jax.lax.dynamic_update_slice(c, new.astype(c.dtype), at)
                          for c, new in zip(cache, (k, v)))
        if x.dtype == jnp.float16 and jax.default_backend() == "cpu":
            # XLA:CPU has no fp16 x fp16 -> fp32 dot (the scores' accumulation): use fp32 there.
            q, k, v = (a.astype(jnp.float32) for a in (q, k, v))
        if pos is None:
            impl = devices.attention_implementation(q.shape, q.dtype, self.kv_heads, causal=True)
            with jax.named_scope("attention"):  # a name only (the profile capability)
                y = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
        else:  # XLA's: a (B, 1, heads, S) score row, no flash kernel to gain from
            ck, cv = (c.astype(q.dtype) for c in cache)
            lengths = jnp.broadcast_to(pos + 1, (b,)).astype(jnp.int32)
            y = jax.nn.dot_product_attention(q, ck, cv, key_value_seq_lengths=lengths,
                                             implementation="xla")
        return self.o_proj(y.astype(x.dtype).reshape(b, t, -1)), cache


class LlamaMlp(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, mlp_dim: int, *, dtype: Dtype, rngs: nnx.Rngs) -> None:
        self.gate_proj = _linear(hidden, mlp_dim, dtype, rngs)
        self.up_proj = _linear(hidden, mlp_dim, dtype, rngs)
        self.down_proj = _linear(mlp_dim, hidden, dtype, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(nnx.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nnx.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, arch: Arch, *, dtype: Dtype, rngs: nnx.Rngs) -> None:
        self.input_layernorm = _rms_norm(arch.hidden, arch.norm_eps, rngs)
        self.self_attn = LlamaAttention(arch, dtype=dtype, rngs=rngs)
        self.post_attention_layernorm = _rms_norm(arch.hidden, arch.norm_eps, rngs)
        self.mlp = LlamaMlp(arch.hidden, arch.mlp_dim, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
        """Training: (B, T, C) -> (B, T, C), no cache (what memory=checkpoint rematerialises)."""
        return self.cached(x, cos, sin)[0]

    def cached(self, x: jax.Array, cos: jax.Array, sin: jax.Array, cache: KV | None = None,
               pos: jax.Array | None = None) -> tuple[jax.Array, KV | None]:
        y, cache = self.self_attn(self.input_layernorm(x).astype(x.dtype), cos, sin, cache, pos)
        x = x + y
        return x + self.mlp(self.post_attention_layernorm(x).astype(x.dtype)), cache


class Llama(nnx.Module):
    """Llama decoder LM: token embedding, pre-norm blocks, final RMSNorm, output projection
    (the embedding matrix itself when ``tied_embeddings``)."""

    def __init__(self, arch: Arch, *, dtype: Dtype, rngs: nnx.Rngs) -> None:
        self.head_dim, self.theta = arch.hidden // arch.heads, float(arch.rope_theta)
        self.embed_tokens = nnx.Embed(arch.vocab_size, arch.hidden, embedding_init=_normal_init,
                                      dtype=dtype, rngs=rngs)
        self.blocks = nnx.List(LlamaBlock(arch, dtype=dtype, rngs=rngs)
                               for _ in range(arch.layers))
        self.norm = _rms_norm(arch.hidden, arch.norm_eps, rngs)
        self.lm_head = None if arch.tied_embeddings else _linear(arch.hidden, arch.vocab_size,
                                                                dtype, rngs)

    def __call__(self, ids: jax.Array) -> jax.Array:  # (B, T) int -> (B, T, vocab)
        cos, sin = rope(jnp.arange(ids.shape[1]), self.head_dim, self.theta)
        x = self.embed_tokens(ids)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self._logits(x)

    def _logits(self, x: jax.Array) -> jax.Array:
        x = self.norm(x).astype(x.dtype)
        if self.lm_head is None:
            return _attend(self.embed_tokens, x)  # tied: (B, T, hidden) @ (hidden, vocab)
        return self.lm_head(x)

    def init_cache(self, batch: int, length: int, dtype: Dtype) -> list[KV]:
        """Zeroed keys and values for ``length`` positions, per layer."""
        attn = self.blocks[0].self_attn
        shape = (batch, length, attn.kv_heads, attn.head_dim)
        return [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in self.blocks]

    def decode(self, ids: jax.Array, cache: list[KV], pos: jax.Array | None = None,
               last: jax.Array | None = None) -> tuple[jax.Array, list[KV]]:
        """Logits of the last position (B, vocab) and the updated cache: the prompt ids (B, T)
        from position 0 when ``pos`` is None (prefill), else one token per row (B, 1) at the
        traced position ``pos`` (a scalar, or (B,): each row at its own). ``last``: the
        position whose logits a prefill returns (a prompt padded at its end), traced."""
        start = 0 if pos is None else pos
        positions = (start[:, None] if pos is not None and pos.ndim == 1 else start)
        cos, sin = rope(positions + jnp.arange(ids.shape[1]), self.head_dim, self.theta)
        x, out = self.embed_tokens(ids), []
        for block, kv in zip(self.blocks, cache):
            x, kv = block.cached(x, cos, sin, kv, pos)
            out.append(kv)
        at = x.shape[1] - 1 if last is None else last
        return self._logits(jax.lax.dynamic_slice_in_dim(x, at, 1, axis=1))[:, 0], out


_REMAT: dict[type, type] = {}  # block class -> its rematerialised subclass, made once


def checkpoint_blocks(blocks: Iterable[nnx.Module]) -> None:
    """memory=checkpoint: each block (a transformer block / ResNet bottleneck, ``model.blocks``;
    a user's model: its policy's blocks) becomes a subclass whose
    ``__call__`` is ``nnx.remat``'d (``jax.checkpoint``): the backward pass recomputes the
    block's activations from its input instead of keeping them. Same math; BatchNorm's
    statistics update is carried out of the remat as any nnx state."""
    for block in blocks:
        cls = type(block)
        if cls not in _REMAT:
            _REMAT[cls] = type(f"Remat{cls.__name__}", (cls,), {"__call__": nnx.remat(cls.__call__)})
        block.__class__ = _REMAT[cls]


# model family -> its Flax builder, called as (arch, dtype=, rngs=), and the choices that go
# with it (fxtrack.frameworks.base.Builder); a new family runs in JAX once it has one here.
BUILDERS: dict[str, Builder] = {
    "resnet": Builder(ResNet, convolutional=True),
    "vit": Builder(ViT, attention="full"),
    "bert": Builder(Bert, attention="full"),
    "llama": Builder(Llama, attention="causal_gqa"),
}


def build(arch: Arch, dtype: Dtype = jnp.float32, rngs: nnx.Rngs | None = None) -> nnx.Module:
    """The Flax model for ``arch`` with ``dtype`` compute and float32 parameters."""
    return BUILDERS[arch.family].build(arch, dtype=dtype, rngs=rngs or nnx.Rngs(0))
