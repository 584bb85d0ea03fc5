"""ResNet-50 v1.5, ViT, BERT (masked-LM) and a Llama decoder as PyTorch ``nn.Module``s, sized by
``Arch``."""

from __future__ import annotations

import functools
from typing import Iterable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fxtrack.architectures import Arch
from fxtrack.frameworks.base import (BATCH_NORM_EPS, BATCH_NORM_MOMENTUM, BERT_LAYER_NORM_EPS,
                                     VIT_LAYER_NORM_EPS, Builder, patch_grid, patch_hw)


# ----------------------------------------------------------------------------- ResNet-50 v1.5
class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride: the "v1.5" change), 1x1 expand x4, residual."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = _bn(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = _bn(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = _bn(out_ch)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                                            _bn(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + identity)


def _bn(ch: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(ch, eps=BATCH_NORM_EPS, momentum=BATCH_NORM_MOMENTUM)


class ResNet(nn.Module):
    def __init__(self, arch: Arch) -> None:
        super().__init__()
        w = arch.width
        self.conv1 = nn.Conv2d(3, w, 7, stride=2, padding=3, bias=False)
        self.bn1 = _bn(w)
        stages, in_ch = [], w
        for i, blocks in enumerate(arch.stage_sizes):
            width = w * 2**i
            for b in range(blocks):
                stages.append(Bottleneck(in_ch, width, stride=2 if b == 0 and i > 0 else 1))
                in_ch = width * Bottleneck.expansion
        self.blocks = nn.Sequential(*stages)
        self.fc = nn.Linear(in_ch, arch.num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W) -> (B, classes)
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(x, 3, stride=2, padding=1)
        x = self.blocks(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# ----------------------------------------------------------------------------- transformers
class SelfAttention(nn.Module):
    """Multi-head self-attention through SDPA (flash / memory-efficient kernels where present)."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        # [q | k | v] split along the features, each (B, heads, T, head_dim): one permute of a
        # (3, B, heads, T, head_dim) view instead made the eager fp32 step ~5% slower
        # (docs/measurements.md#torchs-vit-against-hugging-faces-2026-12-07)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v)  # (B, heads, T, head_dim)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Mlp(nn.Sequential):
    def __init__(self, hidden: int, mlp_dim: int) -> None:
        super().__init__(nn.Linear(hidden, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, hidden))


class Block(nn.Module):
    """A transformer encoder block: pre-LN (ViT) or post-LN (BERT)."""

    def __init__(self, hidden: int, heads: int, mlp_dim: int, eps: float, pre_norm: bool) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.norm1 = nn.LayerNorm(hidden, eps=eps)
        self.attn = SelfAttention(hidden, heads)
        self.norm2 = nn.LayerNorm(hidden, eps=eps)
        self.mlp = Mlp(hidden, mlp_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.mlp(x))


def _blocks(arch: Arch, pre_norm: bool, eps: float) -> nn.ModuleList:
    return nn.ModuleList(Block(arch.hidden, arch.heads, arch.mlp_dim, eps, pre_norm)
                         for _ in range(arch.layers))


def _init_transformer(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


class ViT(nn.Module):
    def __init__(self, arch: Arch) -> None:
        super().__init__()
        h = arch.hidden
        rows, columns = patch_grid(arch)
        tokens = rows * columns + 1  # patches + class token
        self.patch_embed = nn.Conv2d(3, h, patch_hw(arch), stride=patch_hw(arch))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, h))
        self.pos_embed = nn.Parameter(torch.randn(1, tokens, h) * 0.02)
        self.blocks = _blocks(arch, pre_norm=True, eps=VIT_LAYER_NORM_EPS)
        self.norm = nn.LayerNorm(h, eps=VIT_LAYER_NORM_EPS)
        self.head = nn.Linear(h, arch.num_classes)
        _init_transformer(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W) -> (B, classes)
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # (B, patches, hidden)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


class Bert(nn.Module):
    """BERT encoder with the masked-LM head; the decoder reuses the word-embedding matrix."""

    def __init__(self, arch: Arch) -> None:
        super().__init__()
        h, eps = arch.hidden, BERT_LAYER_NORM_EPS
        self.word_embeddings = nn.Embedding(arch.vocab_size, h)
        self.position_embeddings = nn.Embedding(arch.max_position, h)
        self.token_type_embeddings = nn.Embedding(arch.type_vocab, h)
        self.embed_norm = nn.LayerNorm(h, eps=eps)
        self.blocks = _blocks(arch, pre_norm=False, eps=eps)
        self.mlm_dense = nn.Linear(h, h)
        self.mlm_norm = nn.LayerNorm(h, eps=eps)
        self.mlm_bias = nn.Parameter(torch.zeros(arch.vocab_size))
        _init_transformer(self)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, vocab)
        t = ids.shape[1]
        x = (self.word_embeddings(ids) + self.position_embeddings.weight[:t]
             + self.token_type_embeddings.weight[0])  # a single segment: token type 0
        x = self.embed_norm(x)
        for block in self.blocks:
            x = block(x)
        x = self.mlm_norm(F.gelu(self.mlm_dense(x)))
        return F.linear(x, self.word_embeddings.weight, self.mlm_bias)  # tied decoder


# ----------------------------------------------------------------------------- Llama decoder
# Parameter names follow Hugging Face's LlamaForCausalLM up to a prefix table
# (tests/convert_llama.py): embed_tokens, blocks.i.attn.{q,k,v,o}_proj, blocks.i.mlp.{gate,up,
# down}_proj, blocks.i.{attn,mlp}_norm, norm, lm_head (untied only).
class RMSNorm(nn.RMSNorm):
    """RMSNorm computed in fp32 whatever autocast gives it (as Llama's reference does), cast back."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.float()).to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """theta^(-2i/hd) for the hd/2 channel pairs, computed as Hugging Face does (bit-equal cos/sin)."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE pairing: channel i with channel i + hd/2."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(nn.Module):
    """Grouped-query causal attention through SDPA (``enable_gqa``: K/V keep their kv_heads).

    With a ``cache`` (this layer's preallocated (B, kv_heads, L, hd) K and V): ``pos`` None is a
    prefill from position 0 (K/V written at [0, t), causal attention over the fresh ones); a
    ``pos`` tensor of t positions writes K/V there and attends over the whole cache, masked to
    the positions <= each query's (a static shape, so a compiled decode step never recompiles);
    a (B, 1) ``pos`` is one position per row (continuous batching: each slot at its own)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Optional[Sequence[torch.Tensor]] = None,
                pos: Optional[torch.Tensor] = None) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # autocast's dtype: no fp32 promotion
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if cache is not None and pos is not None and pos.dim() == 2:  # one position per row
            k_all, v_all = cache
            rows, at = torch.arange(b, device=x.device), pos[:, 0]
            k_all[rows, :, at] = k[:, :, 0].to(k_all.dtype)
            v_all[rows, :, at] = v[:, :, 0].to(v_all.dtype)
            mask = (torch.arange(k_all.shape[2], device=x.device) <= pos)[:, None, None]
            y = F.scaled_dot_product_attention(q, k_all.to(q.dtype), v_all.to(q.dtype),
                                               attn_mask=mask, enable_gqa=True)
        elif cache is not None and pos is not None:  # decode: through the whole static cache
            k_all, v_all = cache
            k_all.index_copy_(2, pos, k.to(k_all.dtype))
            v_all.index_copy_(2, pos, v.to(v_all.dtype))
            mask = torch.arange(k_all.shape[2], device=x.device) <= pos[:, None]  # (t, L)
            y = F.scaled_dot_product_attention(q, k_all.to(q.dtype), v_all.to(q.dtype),
                                               attn_mask=mask, enable_gqa=True)
        else:
            if cache is not None:  # prefill: keep K/V for the decode steps
                cache[0][:, :, :t] = k
                cache[1][:, :, :t] = v
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class LlamaMlp(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, hidden: int, mlp_dim: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, mlp_dim, bias=False)
        self.up_proj = nn.Linear(hidden, mlp_dim, bias=False)
        self.down_proj = nn.Linear(mlp_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, arch: Arch) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(arch.hidden, eps=arch.norm_eps)
        self.attn = LlamaAttention(arch.hidden, arch.heads, arch.kv_heads)
        self.mlp_norm = RMSNorm(arch.hidden, eps=arch.norm_eps)
        self.mlp = LlamaMlp(arch.hidden, arch.mlp_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Optional[Sequence[torch.Tensor]] = None,
                pos: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, cache, pos)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """Decoder LM: ids (B, T) -> next-token logits (B, T, vocab). ``cache`` (one (K, V) pair per
    layer) and ``pos`` turn the same forward into a prefill or a decode step (LlamaAttention)."""

    def __init__(self, arch: Arch) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden)
        self.blocks = nn.ModuleList(LlamaBlock(arch) for _ in range(arch.layers))
        self.norm = RMSNorm(arch.hidden, eps=arch.norm_eps)
        self.lm_head = None if arch.tied_embeddings else nn.Linear(arch.hidden, arch.vocab_size,
                                                                    bias=False)
        # Not a parameter nor saved: derived from the architecture.
        self.register_buffer("inv_freq", rope_inv_freq(arch.hidden // arch.heads, arch.rope_theta),
                             persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids: torch.Tensor, cache: Optional[Sequence[Sequence[torch.Tensor]]] = None,
                pos: Optional[torch.Tensor] = None) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device) if pos is None else pos
        freqs = positions.float()[..., None] * self.inv_freq  # (T, hd/2) or (B, 1, hd/2), fp32
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if positions.dim() == 2:  # a position per row: (B, 1, 1, hd) against (B, heads, 1, hd)
            cos, sin = cos[:, None], sin[:, None]
        x = self.embed_tokens(ids)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, None if cache is None else cache[i], pos)
        x = self.norm(x)
        if self.lm_head is None:  # tied: the output projection is the embedding matrix
            return F.linear(x, self.embed_tokens.weight)
        return self.lm_head(x)


def checkpoint_blocks(blocks: Iterable[nn.Module]) -> None:
    """memory=checkpoint: each block (a transformer block / ResNet bottleneck, ``model.blocks``;
    a user's model: its policy's blocks) keeps only its input from the forward and recomputes
    its activations in backward (``torch.utils.checkpoint``, non-reentrant). Same math;
    BatchNorm's running statistics see each batch twice (the recompute runs in training mode
    too), which changes no training-mode output."""
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


# model family -> its torch builder and the choices that go with it: the framework's side of a
# family (fxtrack.families names no framework); a new family runs in torch once it has one here.
BUILDERS: dict[str, Builder] = {
    "resnet": Builder(ResNet, convolutional=True),
    "vit": Builder(ViT, attention="full"),
    "bert": Builder(Bert, attention="full"),
    "llama": Builder(Llama, attention="causal_gqa"),
}


def build(arch: Arch) -> nn.Module:
    return BUILDERS[arch.family].build(arch)
