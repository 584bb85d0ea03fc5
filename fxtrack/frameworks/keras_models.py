"""ResNet-50 v1.5, ViT, BERT (masked-LM) and a Llama decoder as Keras 3 models, sized by ``Arch``.

Shared by the two Keras-based frameworks (``framework=tensorflow``, ``framework=keras``), which
stay independent packages: this module imports only ``keras`` (layers and ``keras.ops``), so it
builds the same model on every Keras backend.

Layouts are Keras' defaults: images NHWC, conv kernels HWIO, dense kernels (in, out). Every layer
is named after where it sits (``stage2_block1_conv2``, ``block0_attn_qkv``), so the weights map
one to one onto the PyTorch modules (tests/convert_tensorflow.py). Precision comes from the
Keras dtype policy that is global while a model is built, and so does the matmul a framework
may give its dense layers and tied projections (``matmul_form``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional

import keras
import numpy as np
from keras import layers, ops

from fxtrack.architectures import Arch
from fxtrack.frameworks.base import (BATCH_NORM_EPS, BATCH_NORM_MOMENTUM, BERT_LAYER_NORM_EPS,
                                     VIT_LAYER_NORM_EPS, Builder, image_hw, patch_grid, patch_hw)


def conv_init() -> keras.initializers.Initializer:
    """torch's ``kaiming_normal_(mode="fan_out", nonlinearity="relu")``. A fresh initializer per
    layer: an unseeded Keras initializer fixes its seed when constructed (from Python's
    ``random``, seeded by ``keras.utils.set_random_seed``), so a shared instance would give
    every layer of one shape the same values."""
    return keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal")


def dense_init() -> keras.initializers.Initializer:
    """N(0, 0.02), BERT's and ViT's init for dense and embedding matrices, as torch's
    ``trunc_normal_(std=0.02)`` draws it: torch cuts at +-2 *absolute* (100 sigma), i.e. not at
    all, where Keras' TruncatedNormal cuts at 2 sigma (fresh per layer, see ``conv_init``)."""
    return keras.initializers.RandomNormal(stddev=0.02)


def torch_default_init() -> keras.initializers.Initializer:
    """torch's default ``nn.Linear`` / ``nn.Conv2d`` weight, U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    (ResNet's classifier, ViT's patch embedding), where Keras' default is Glorot."""
    return keras.initializers.VarianceScaling(1 / 3, "fan_in", "uniform")


def torch_bias_init(fan_in: int) -> keras.initializers.Initializer:
    """torch's default bias for those layers: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = fan_in ** -0.5
    return keras.initializers.RandomUniform(-bound, bound)


def gelu(x):
    """Exact (erf) GELU, as torch's default; Keras' own default is the tanh approximation."""
    return keras.activations.gelu(x, approximate=False)


# ----------------------------------------------------------------------------- ResNet-50 v1.5
def _bn(name: str) -> layers.BatchNormalization:
    # Keras' momentum is the weight of the old statistic: 1 - torch's momentum.
    return layers.BatchNormalization(momentum=1.0 - BATCH_NORM_MOMENTUM, epsilon=BATCH_NORM_EPS,
                                     name=name)


def _conv(x, filters: int, kernel: int, stride: int, name: str):
    """Conv without bias, padded symmetrically like torch's ``padding=kernel // 2``.

    Keras' ``"same"`` pads stride-2 convolutions asymmetrically (0 before, 1 after for a 3x3; TF's
    convention, on every backend), so strided convolutions get an explicit ``ZeroPadding2D`` and
    ``"valid"`` instead."""
    if stride > 1 and kernel > 1:
        x = layers.ZeroPadding2D(kernel // 2, name=f"{name}_pad")(x)
        padding = "valid"
    else:
        padding = "same"
    return Conv2D(filters, kernel, strides=stride, padding=padding, use_bias=False,
                  kernel_initializer=conv_init(), name=name)(x)


def conv_bn(x, filters: int, kernel: int, stride: int, name: str, index: str = "",
            relu: bool = True):
    """Conv -> BatchNorm (-> ReLU), named ``{name}_conv{index}``, ``{name}_bn{index}``."""
    x = _conv(x, filters, kernel, stride, f"{name}_conv{index}")
    x = _bn(f"{name}_bn{index}")(x)
    return layers.ReLU(name=f"{name}_relu{index}")(x) if relu else x


def bottleneck(x, width: int, stride: int, name: str):
    """1x1 reduce, 3x3 (carries the stride: the "v1.5" change), 1x1 expand x4, residual."""
    out_ch = 4 * width
    identity = x
    if stride != 1 or x.shape[-1] != out_ch:
        identity = conv_bn(x, out_ch, 1, stride, f"{name}_downsample", relu=False)
    y = conv_bn(x, width, 1, 1, name, "1")
    y = conv_bn(y, width, 3, stride, name, "2")
    y = conv_bn(y, out_ch, 1, 1, name, "3", relu=False)
    return layers.ReLU(name=f"{name}_out")(layers.Add(name=f"{name}_add")([y, identity]))


def resnet(arch: Arch) -> keras.Model:
    """(B, H, W, 3) images -> (B, classes) logits."""
    images = keras.Input((arch.image_size, arch.image_size, 3), name="images")
    x = conv_bn(images, arch.width, 7, 2, "stem")  # (B, H/2, W/2, 64)
    # Zero padding equals torch's -inf padding here: the input is post-ReLU, so >= 0.
    x = layers.ZeroPadding2D(1, name="stem_pool_pad")(x)
    x = layers.MaxPooling2D(3, strides=2, name="stem_pool")(x)  # (B, H/4, W/4, 64)
    for i, blocks in enumerate(arch.stage_sizes):
        for b in range(blocks):
            x = bottleneck(x, arch.width * 2**i, 2 if b == 0 and i > 0 else 1,
                           f"stage{i + 1}_block{b + 1}")
    x = layers.GlobalAveragePooling2D(name="avg_pool")(x)  # (B, 2048)
    logits = Dense(arch.num_classes, kernel_initializer=torch_default_init(),
                   bias_initializer=torch_bias_init(x.shape[-1]), name="head")(x)
    return keras.Model(images, logits, name=arch.name)


# ----------------------------------------------------------------------------- transformers
class ClassToken(layers.Layer):
    """Prepends one learned token: (B, N, C) -> (B, N + 1, C)."""

    def build(self, input_shape):
        self.token = self.add_weight(shape=(1, 1, input_shape[-1]), initializer="zeros",
                                     name="token")

    def call(self, x):
        token = ops.broadcast_to(ops.cast(self.token, x.dtype), (ops.shape(x)[0], 1, x.shape[-1]))
        return ops.concatenate([token, x], axis=1)


class PositionEmbedding(layers.Layer):
    """Adds rows [0, T) of a learned (max_length, C) table to (B, T, C)."""

    def __init__(self, max_length: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.max_length = max_length

    def build(self, input_shape):
        self.embeddings = self.add_weight(shape=(self.max_length, input_shape[-1]),
                                          initializer=dense_init(), name="embeddings")

    def call(self, x):
        return x + ops.cast(self.embeddings[: x.shape[1]], x.dtype)


class TokenTypeZero(layers.Layer):
    """Adds row 0 of a learned (type_vocab, C) token-type table to every position of (B, T, C):
    a single-segment input, broadcast rather than looked up."""

    def __init__(self, type_vocab: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.type_vocab = type_vocab

    def build(self, input_shape):
        self.embeddings = self.add_weight(shape=(self.type_vocab, input_shape[-1]),
                                          initializer=dense_init(), name="embeddings")

    def call(self, x):
        return x + ops.cast(self.embeddings[0], x.dtype)


class Bias(layers.Layer):
    """A learned bias on the last axis (the tied MLM decoder has a bias of its own)."""

    def build(self, input_shape):
        self.bias = self.add_weight(shape=(input_shape[-1],), initializer="zeros", name="bias")

    def call(self, x):
        return x + ops.cast(self.bias, x.dtype)


# (x, w, w_transposed) -> x @ w or x @ w.T, for the layers built inside ``matmul_form``
Matmul = Callable[..., "keras.KerasTensor"]
_MATMUL: Optional[Matmul] = None
# (x, kernel, strides) -> an unpadded 1x1 convolution as its product, likewise
_POINTWISE: Optional[Callable[..., "keras.KerasTensor"]] = None


@contextlib.contextmanager
def matmul_form(matmul: Optional[Matmul],
                pointwise: Optional[Callable[..., Any]] = None) -> Iterator[None]:
    """Dense layers and tied output projections built inside use ``matmul`` (a framework's
    faster form of the same product, e.g. tensorflow/matmul.py) instead of ``ops.matmul``, and
    1x1 convolutions ``pointwise`` (the same product as a matmul) instead of ``ops.conv``."""
    global _MATMUL, _POINTWISE
    previous, _MATMUL, _POINTWISE = (_MATMUL, _POINTWISE), matmul, pointwise
    try:
        yield
    finally:
        _MATMUL, _POINTWISE = previous


class Conv2D(layers.Conv2D):
    """``layers.Conv2D`` whose 1x1 kernels compute as the ``matmul_form``'s ``pointwise`` they
    were built in, if any (channels-last, unpadded: "same" pads nothing around a 1x1)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        pointwise = self.kernel_size == (1, 1) and self.data_format == "channels_last"
        self._pointwise = _POINTWISE if pointwise else None

    def convolution_op(self, inputs, kernel):
        if self._pointwise is None:
            return super().convolution_op(inputs, kernel)
        return self._pointwise(inputs, ops.cast(kernel, inputs.dtype), self.strides)


class Dense(layers.Dense):
    """``layers.Dense`` whose product is the ``matmul_form`` it was built in, if any."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._matmul = _MATMUL

    def call(self, inputs, training=None):
        if self._matmul is None:
            return super().call(inputs, training)
        x = self._matmul(inputs, ops.cast(self.kernel, inputs.dtype))
        if self.bias is not None:
            x = ops.add(x, ops.cast(self.bias, x.dtype))
        return x if self.activation is None else self.activation(x)


class ReversibleEmbedding(layers.ReversibleEmbedding):
    """``layers.ReversibleEmbedding`` whose reverse (the output projection) is the
    ``matmul_form`` it was built in, if any, in the activations' dtype (or ``reverse_dtype``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._matmul = _MATMUL

    def call(self, inputs, reverse=False):
        if not reverse or self._matmul is None:
            return super().call(inputs, reverse=reverse)
        dtype = self.reverse_dtype or inputs.dtype
        inputs = ops.cast(inputs, dtype)
        if self.tie_weights:  # embeddings (vocab, C): x @ E^T
            return self._matmul(inputs, ops.cast(self.embeddings, dtype), True)
        return self._matmul(inputs, ops.cast(self.reverse_embeddings, dtype))  # (C, vocab)


def _dense(units: int, name: str, activation=None) -> layers.Dense:
    """A dense layer with the transformers' N(0, 0.02) kernel and a zero bias."""
    return Dense(units, activation=activation, kernel_initializer=dense_init(), name=name)


def self_attention(x, heads: int, name: str):
    """Multi-head self-attention: one fused qkv projection (as torch), Keras' attention op."""
    t, c = x.shape[1], x.shape[2]
    qkv = _dense(3 * c, f"{name}_qkv")(x)  # (B, T, 3C), laid out [q | k | v]
    q, k, v = (ops.reshape(z, (-1, t, heads, c // heads)) for z in ops.split(qkv, 3, axis=-1))
    y = ops.dot_product_attention(q, k, v)  # (B, T, heads, head_dim), softmax(qk^T/sqrt(d)) v
    return _dense(c, f"{name}_proj")(ops.reshape(y, (-1, t, c)))


def encoder_block(x, arch: Arch, pre_norm: bool, eps: float, name: str):
    """A transformer encoder block: pre-LN (ViT) or post-LN (BERT); dropout 0."""
    norm1 = layers.LayerNormalization(epsilon=eps, name=f"{name}_norm1")
    norm2 = layers.LayerNormalization(epsilon=eps, name=f"{name}_norm2")

    def ffn(z):
        z = _dense(arch.mlp_dim, f"{name}_mlp_fc1", activation=gelu)(z)
        return _dense(arch.hidden, f"{name}_mlp_fc2")(z)

    add1, add2 = layers.Add(name=f"{name}_add1"), layers.Add(name=f"{name}_add2")
    if pre_norm:
        x = add1([x, self_attention(norm1(x), arch.heads, f"{name}_attn")])
        return add2([x, ffn(norm2(x))])
    x = norm1(add1([x, self_attention(x, arch.heads, f"{name}_attn")]))
    return norm2(add2([x, ffn(x)]))


def vit(arch: Arch) -> keras.Model:
    """(B, H, W, 3) images -> (B, classes) logits; class token, learned positions, pre-LN."""
    (rows, columns), patch = patch_grid(arch), patch_hw(arch)
    images = keras.Input((*image_hw(arch), 3), name="images")
    x = layers.Conv2D(arch.hidden, patch, strides=patch,
                      kernel_initializer=torch_default_init(),
                      bias_initializer=torch_bias_init(3 * patch[0] * patch[1]),
                      name="patch_embed")(images)
    # (B, rows, columns, C) -> (B, patches, C), row-major order as torch's flatten(2)
    x = layers.Reshape((rows * columns, arch.hidden), name="patch_flatten")(x)
    x = ClassToken(name="cls_token")(x)  # (B, patches + 1, C)
    x = PositionEmbedding(rows * columns + 1, name="pos_embed")(x)
    for i in range(arch.layers):
        x = encoder_block(x, arch, pre_norm=True, eps=VIT_LAYER_NORM_EPS, name=f"block{i}")
    x = layers.LayerNormalization(epsilon=VIT_LAYER_NORM_EPS, name="final_norm")(x[:, 0])
    logits = _dense(arch.num_classes, "head")(x)
    return keras.Model(images, logits, name=arch.name)


def bert(arch: Arch) -> keras.Model:
    """(B, T) token ids -> (B, T, vocab) logits; post-LN encoder, tied masked-LM decoder."""
    ids = keras.Input((arch.seq_len,), dtype="int32", name="input_ids")
    eps, h = BERT_LAYER_NORM_EPS, arch.hidden
    word = ReversibleEmbedding(arch.vocab_size, h, embeddings_initializer=dense_init(),
                               name="word_embeddings")
    # A single segment: every token has type 0, so row 0 is broadcast (as torch and JAX do),
    # not gathered per token.
    x = TokenTypeZero(arch.type_vocab, name="token_type_embeddings")(word(ids))
    x = PositionEmbedding(arch.max_position, name="position_embeddings")(x)
    x = layers.LayerNormalization(epsilon=eps, name="embed_norm")(x)  # (B, T, C)
    for i in range(arch.layers):
        x = encoder_block(x, arch, pre_norm=False, eps=eps, name=f"block{i}")
    x = _dense(h, "mlm_dense", activation=gelu)(x)
    x = layers.LayerNormalization(epsilon=eps, name="mlm_norm")(x)
    logits = Bias(name="mlm_bias")(word(x, reverse=True))  # tied decoder: x @ E^T + b
    return keras.Model(ids, logits, name=arch.name)


# ----------------------------------------------------------------------------- Llama decoder
class RMSNorm(layers.Layer):
    """x * rsqrt(mean(x^2) + eps) * scale, normalised in fp32 whatever the compute dtype; the
    scale multiplies after the cast back, as Hugging Face's LlamaRMSNorm does."""

    def __init__(self, eps: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.eps = eps

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="scale")

    def call(self, x):
        x32 = ops.cast(x, "float32")
        y = x32 * ops.rsqrt(ops.mean(ops.square(x32), axis=-1, keepdims=True) + self.eps)
        return ops.cast(y, x.dtype) * ops.cast(self.scale, x.dtype)


def rope(x, positions, theta: float):
    """Rotary embedding, the rotate-half convention (channel i pairs with i + hd/2) on
    (B, T, heads, hd) at ``positions`` (T,), or (B, T): a position per row (continuous
    batching's slots); the angles in fp32, as Hugging Face computes them."""
    hd = x.shape[-1]
    inv_freq = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))  # (hd/2,)
    angles = ops.cast(positions, "float32")[..., None] * inv_freq.astype(np.float32)
    angles = ops.concatenate([angles, angles], axis=-1)
    # (1, T, 1, hd), or (B, T, 1, hd) per row
    angles = angles[:, :, None, :] if len(positions.shape) == 2 else angles[None, :, None, :]
    cos, sin = ops.cast(ops.cos(angles), x.dtype), ops.cast(ops.sin(angles), x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + ops.concatenate([-x2, x1], axis=-1) * sin


def gqa_attention(q, k, v, mask=None):
    """``ops.dot_product_attention`` on (B, T, heads, hd) queries and (B, S, kv_heads, hd) keys
    and values: causal when no ``mask`` is given (T == S), else the boolean mask (broadcast to
    (B, heads, T, S)). The op itself groups the query heads over fewer KV heads (native on JAX,
    a repeat on TensorFlow and torch), except for a single KV head, which Keras' TensorFlow and
    torch backends leave unrepeated: repeated here."""
    heads, kv_heads = q.shape[2], k.shape[2]
    if kv_heads == 1 and heads > 1:
        k, v = ops.repeat(k, heads, axis=2), ops.repeat(v, heads, axis=2)
    return ops.dot_product_attention(q, k, v, mask=mask, is_causal=mask is None)


def _proj(units: int, name: str) -> layers.Dense:
    """A bias-free projection with Llama's N(0, 0.02) kernel."""
    return Dense(units, use_bias=False, kernel_initializer=dense_init(), name=name)


class LlamaBlock(layers.Layer):
    """x + attn(RMSNorm(x)); x + mlp(RMSNorm(x)). ``call`` is the causal forward of a whole
    sequence; ``qkv`` and ``finish`` are its two halves, which a decoder calls around its own
    KV cache (fxtrack.frameworks.tensorflow.generate)."""

    def __init__(self, arch: Arch, **kwargs) -> None:
        super().__init__(**kwargs)
        self.heads, self.kv_heads = arch.heads, arch.kv_heads
        self.head_dim, self.theta = arch.hidden // arch.heads, float(arch.rope_theta)
        kv = arch.kv_heads * self.head_dim
        self.attn_norm = RMSNorm(arch.norm_eps, name="attn_norm")
        self.q_proj = _proj(arch.heads * self.head_dim, "q_proj")
        self.k_proj, self.v_proj = _proj(kv, "k_proj"), _proj(kv, "v_proj")
        self.o_proj = _proj(arch.hidden, "o_proj")
        self.mlp_norm = RMSNorm(arch.norm_eps, name="mlp_norm")
        self.gate_proj = _proj(arch.mlp_dim, "gate_proj")
        self.up_proj = _proj(arch.mlp_dim, "up_proj")
        self.down_proj = _proj(arch.hidden, "down_proj")

    def build(self, input_shape):
        # explicit, so that building allocates nothing beyond the weights (shape-only counts)
        c, inner = input_shape[-1], self.heads * self.head_dim
        for norm in (self.attn_norm, self.mlp_norm):
            norm.build(input_shape)
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.gate_proj, self.up_proj):
            proj.build((None, c))
        self.o_proj.build((None, inner))
        self.down_proj.build((None, self.gate_proj.units))

    def qkv(self, x, positions):
        """(B, T, C) -> q (B, T, heads, hd), k and v (B, T, kv_heads, hd), RoPE applied to q
        and k at ``positions`` (T,)."""
        h = self.attn_norm(x)
        b, t = ops.shape(h)[0], ops.shape(h)[1]
        q = ops.reshape(self.q_proj(h), (b, t, self.heads, self.head_dim))
        k = ops.reshape(self.k_proj(h), (b, t, self.kv_heads, self.head_dim))
        v = ops.reshape(self.v_proj(h), (b, t, self.kv_heads, self.head_dim))
        return rope(q, positions, self.theta), rope(k, positions, self.theta), v

    def finish(self, x, attended):
        """The residual after attention ((B, T, heads, hd) ``attended``), then the SwiGLU MLP."""
        b, t = ops.shape(attended)[0], ops.shape(attended)[1]
        x = x + self.o_proj(ops.reshape(attended, (b, t, self.heads * self.head_dim)))
        h = self.mlp_norm(x)
        return x + self.down_proj(ops.silu(self.gate_proj(h)) * self.up_proj(h))

    def call(self, x):
        q, k, v = self.qkv(x, ops.arange(ops.shape(x)[1]))
        return self.finish(x, gqa_attention(q, k, v))


class Llama(keras.Model):
    """(B, T) token ids -> (B, T, vocab) logits, any T; the output projection tied to the
    embedding (x @ E^T) or a separate (hidden, vocab) matrix. A subclassed model with an
    explicit ``build``: its weights exist without a symbolic pass (which costs seconds per
    layer at full size), and a decoder reaches its parts (``embed``, ``blocks``, ``norm``)."""

    def __init__(self, arch: Arch, **kwargs) -> None:
        super().__init__(name=arch.name, **kwargs)
        # The output projection in the compute dtype like every other matmul: left alone,
        # Keras multiplies bf16 activations by the (unautocast) fp32 embedding in fp32.
        self.embed = ReversibleEmbedding(arch.vocab_size, arch.hidden,
                                         tie_weights=bool(arch.tied_embeddings),
                                         embeddings_initializer=dense_init(),
                                         reverse_dtype=self.compute_dtype,
                                         name="embed_tokens")
        self.blocks = [LlamaBlock(arch, name=f"layer{i}") for i in range(arch.layers)]
        self.norm = RMSNorm(arch.norm_eps, name="final_norm")
        self.hidden = arch.hidden

    def build(self, input_shape=None):
        self.embed.build()
        for block in self.blocks:
            block.build((None, None, self.hidden))
        self.norm.build((None, None, self.hidden))

    def logits(self, x):
        """The final norm and the output projection of (B, T, C) hidden states."""
        return self.embed(self.norm(x), reverse=True)

    def call(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.logits(x)


def llama(arch: Arch) -> keras.Model:
    """The built Llama: inside ``keras.StatelessScope(initialize_variables=False)`` its
    weights are shapes only (nothing allocated), which is how tests count the full sizes."""
    model = Llama(arch)
    model.build((None, None))
    return model


# model family -> its Keras builder (framework=keras and framework=tensorflow both build here)
# and the choices that go with it (fxtrack.frameworks.base.Builder); a new family runs in
# either once it has one here.
BUILDERS: dict[str, Builder] = {
    "resnet": Builder(resnet, convolutional=True),
    "vit": Builder(vit, attention="full"),
    "bert": Builder(bert, attention="full", weighted_loss=True),
    "llama": Builder(llama, attention="causal_gqa"),
}


def build(arch: Arch) -> keras.Model:
    """The Keras model for ``arch`` under the current global dtype policy."""
    return BUILDERS[arch.family].build(arch)


# scenario=converge's shared start (fxtrack.frameworks.initial): a weight's path here -> the
# name PyTorch's model gives the same parameter, and whether it is a matrix to transpose
_TORCH_NAMES = [
    (r"block(\d+)_(norm1|norm2)/gamma", r"blocks.\1.\2.weight"),
    (r"block(\d+)_(norm1|norm2)/beta", r"blocks.\1.\2.bias"),
    (r"block(\d+)_attn_(qkv|proj)/(kernel|bias)", r"blocks.\1.attn.\2.\3"),
    (r"block(\d+)_mlp_fc1/(kernel|bias)", r"blocks.\1.mlp.0.\2"),
    (r"block(\d+)_mlp_fc2/(kernel|bias)", r"blocks.\1.mlp.2.\2"),
    (r"final_norm/gamma", "norm.weight"), (r"final_norm/beta", "norm.bias"),
    (r"final_norm/scale", "norm.weight"),
    (r"cls_token/token", "cls_token"), (r"pos_embed/embeddings", "pos_embed"),
    (r"embed_tokens/embeddings", "embed_tokens.weight"),
    (r"layer(\d+)/(attn_norm|mlp_norm)/scale", r"blocks.\1.\2.weight"),
    (r"layer(\d+)/(q_proj|k_proj|v_proj|o_proj)/kernel", r"blocks.\1.attn.\2.kernel"),
    (r"layer(\d+)/(gate_proj|up_proj|down_proj)/kernel", r"blocks.\1.mlp.\2.kernel"),
    (r"(patch_embed|head|mlm_dense)/(kernel|bias)", r"\1.\2"),
    # BERT's embeddings, its norms outside the blocks and its decoder's bias
    (r"(word|position|token_type)_embeddings/embeddings", r"\1_embeddings.weight"),
    (r"(embed_norm|mlm_norm)/gamma", r"\1.weight"), (r"(embed_norm|mlm_norm)/beta", r"\1.bias"),
    (r"mlm_bias/bias", "mlm_bias"),
]


def torch_name(path: str) -> str:
    """A Keras weight's path (``block0_attn_qkv/kernel``, ``llama/layer0/q_proj/kernel``) as
    PyTorch's name of it, ``kernel`` kept as the leaf (the caller lays it out)."""
    import re

    path = path.removeprefix("llama/")
    for pattern, target in _TORCH_NAMES:
        if re.fullmatch(pattern, path):
            return re.sub(pattern, target, path)
    raise ValueError(f"no PyTorch name for the Keras weight {path!r}")


def load_initial(model: keras.Model, seed: int, value: Any = None) -> None:
    """Every trainable weight from ``fxtrack.frameworks.initial`` in Keras' layout (dense
    kernels (in, out), conv kernels (kH, kW, I, O), the position table without its batch axis).
    ``value``: another source of the same (name, shape, seed) -> array (``initial.loaded``: a
    converge run's saved weights), else the shared start's draw."""
    from fxtrack.frameworks import initial

    value = value or initial.value
    for weight in model.trainable_weights:
        name, shape = torch_name(weight.path), tuple(weight.shape)
        if name.endswith(".kernel") and len(shape) == 2:
            array = value(name[:-len("kernel")] + "weight", shape[::-1], seed).T
        elif name.endswith(".kernel"):  # (kH, kW, I, O) <- (O, I, kH, kW)
            kh, kw, i, o = shape
            array = value(name[:-len("kernel")] + "weight", (o, i, kh, kw),
                          seed).transpose(2, 3, 1, 0)
        elif name == "pos_embed":
            array = value(name, (1, *shape), seed)[0]
        else:
            array = value(name, shape, seed)
        weight.assign(array.astype(weight.dtype) if hasattr(array, "astype") else array)


def saved_weights(model: keras.Model) -> dict[str, Any]:
    """The trainable weights under PyTorch's names and layout: ``load_initial``'s inverse (what
    a converge run keeps, ``fxtrack.frameworks.initial.save``)."""
    out = {}
    for weight in model.trainable_weights:
        name, array = torch_name(weight.path), np.asarray(weight.numpy(), np.float32)
        if name.endswith(".kernel"):
            name = name[:-len("kernel")] + "weight"
            array = array.T if array.ndim == 2 else array.transpose(3, 2, 0, 1)
        elif name == "pos_embed":
            array = array[None]
        out[name] = array
    return out
