"""The language models: BERT (Devlin et al. 2018, masked LM) and Llama (decoder LM).

Their canonical sizes, with the trainable parameter counts docs/contract.md#groups fixes:

- BERT-base / BERT-large with the masked-LM head whose decoder is tied to the word embeddings
  and no pooler (as Hugging Face's ``BertForMaskedLM``): 109,514,298 / 335,174,458.
- Llama 3.2 1B / Llama 3.1 8B dims (Meta's model cards and configs; Grattafiori et al. 2024):
  pre-norm RMSNorm, RoPE, grouped-query attention, SwiGLU MLP, no biases; the 1B ties its output
  projection to the token embedding, the 8B does not: 1,235,814,400 / 8,030,261,248.

``size=tiny``: BERT keeps its widths and gets 2 layers and 16-token sequences; Llama shrinks its
widths too, as the 1B's embedding alone is 263M parameters, more than a 2-core CI machine can
train in seconds. GPU batches: BERT-base at 64 sequences of 128 tokens, as the public benchmarks.

Their synthetic batch: arithmetic progressions of token ids (predictable from their
neighbours); BERT's with 15% of positions replaced by [MASK], Llama's labelled with the next
token at every position. On a byte corpus (data=pycode) the same two forms of its windows:
BERT's masked by the same rule (``mlm_masked``), each row from its own seed.
"""

from __future__ import annotations

from typing import Any

from fxtrack.families import quality
from fxtrack.families.spec import Family, Model
from fxtrack.families.vision import check_heads, encoder_layer_flops

Arch = Any  # fxtrack.architectures.Arch, which imports this package

BERT_MASK_TOKEN = 103  # [MASK] in the uncased BERT vocabulary
BERT_MASK_FRACTION = 0.15  # share of positions the MLM task predicts (Devlin et al.)
BYTE_MASK_TOKEN = 256  # [MASK] on a byte corpus: the id past its 256 bytes
_FIRST_ORDINARY_TOKEN = 1000  # ids below are [PAD], [CLS], [MASK], unused... in BERT's vocabulary


def progressions(rng: Any, batch_size: int, length: int, vocab_size: int) -> Any:
    """(batch_size, length) token ids, each row start + stride * i modulo the vocabulary, from
    a random start and a stride in 1..7 (``scenario=generate``'s prompts too: a trained model
    would continue them)."""
    import numpy as np

    start = rng.integers(0, vocab_size, size=(batch_size, 1))
    stride = rng.integers(1, 8, size=(batch_size, 1))
    return (start + stride * np.arange(length)) % vocab_size


def mlm_masked(tokens: Any, draws: Any, mask_token: int) -> dict[str, Any]:
    """BERT's masked-LM batch of token ids ``tokens`` (B, T), the one masking rule of every
    BERT batch (synthetic or real text): the positions whose uniform draw in ``draws`` (B, T)
    falls below ``BERT_MASK_FRACTION``, and always the first (at least one predicted position
    per sequence), replaced by ``mask_token``. ``input_ids`` (B, T) int32, ``mlm_labels`` (B, T)
    int32 (the original ids) and ``mlm_weights`` (B, T) float32 (1 where the loss applies)."""
    import numpy as np

    masked = draws < BERT_MASK_FRACTION
    masked[:, 0] = True
    return {
        "input_ids": np.where(masked, mask_token, tokens).astype(np.int32),
        "mlm_labels": tokens.astype(np.int32),
        "mlm_weights": masked.astype(np.float32),
    }


def _mlm_batch(rng: Any, arch: "Arch", batch_size: int) -> dict[str, Any]:
    """Arithmetic progressions of ordinary ids, masked by ``mlm_masked`` with [MASK]."""
    import numpy as np

    t, v = arch.seq_len, arch.vocab_size
    lo = min(_FIRST_ORDINARY_TOKEN, v // 2)
    start = rng.integers(lo, v, size=(batch_size, 1))
    stride = rng.integers(1, 8, size=(batch_size, 1))
    tokens = lo + (start - lo + stride * np.arange(t)) % (v - lo)
    return mlm_masked(tokens, rng.random((batch_size, t)),
                      BERT_MASK_TOKEN if BERT_MASK_TOKEN < v else 0)


def _mlm_shapes(arch: "Arch", batch_size: int) -> dict[str, dict[str, Any]]:
    t = [batch_size, arch.seq_len]
    return {"input_ids": {"shape": t, "dtype": "int32"},
            "mlm_labels": {"shape": t, "dtype": "int32"},
            "mlm_weights": {"shape": t, "dtype": "float32"}}


def _next_token_batch(rng: Any, arch: "Arch", batch_size: int) -> dict[str, Any]:
    """``input_ids`` (B, T) and ``labels`` (B, T) int32: the next token at every position (the
    loss is their mean cross-entropy)."""
    import numpy as np

    tokens = progressions(rng, batch_size, arch.seq_len + 1, arch.vocab_size)
    return next_token_windows(tokens.astype(np.int32), [])


def _next_token_shapes(arch: "Arch", batch_size: int) -> dict[str, dict[str, Any]]:
    t = [batch_size, arch.seq_len]
    return {"input_ids": {"shape": t, "dtype": "int32"}, "labels": {"shape": t, "dtype": "int32"}}


def _bert_flops(a: "Arch") -> int:
    t = a.seq_len
    flops = a.layers * encoder_layer_flops(t, a.hidden, a.mlp_dim)
    return flops + 2 * t * a.hidden * a.hidden + 2 * t * a.hidden * a.vocab_size  # MLM head


def llama_params(a: "Arch") -> dict[str, int]:
    """A Llama's parameter count from its dims: ``total`` (what the model holds) and ``matmul``
    (the weights of its matrix multiplies: every projection, and the output projection even when
    it is tied to the embedding; not the embedding lookup nor the norms): FLOPs count the latter
    (fxtrack.flops)."""
    head_dim = a.hidden // a.heads
    attention = 2 * a.hidden * a.hidden + 2 * a.hidden * a.kv_heads * head_dim  # q, o; k, v
    mlp = 3 * a.hidden * a.mlp_dim  # gate, up, down (SwiGLU)
    block = attention + mlp
    embedding = a.vocab_size * a.hidden
    norms = (2 * a.layers + 1) * a.hidden  # two RMSNorms per block and the final one
    total = a.layers * block + norms + embedding * (1 if a.tied_embeddings else 2)
    return {"total": total, "matmul": a.layers * block + embedding}


def _llama_flops(a: "Arch") -> int:
    """Per sequence of seq_len tokens, PaLM's convention (as MaxText and torchtitan report MFU):
    2 x N_matmul x T for the weights, plus 4 x layers x hidden x T^2 for QK^T and AV counted
    over the full T x T square (causal masking is not discounted). Training: 3x, i.e.
    6 N T + 12 L H T^2."""
    t = a.seq_len
    return 2 * llama_params(a)["matmul"] * t + 4 * a.layers * a.hidden * t * t


def _llama_generate_flops(a: "Arch", prompt_len: int, new_tokens: int) -> int:
    """One generated sequence: the prompt's prefill (the forward above at ``prompt_len``
    tokens), then ``new_tokens - 1`` single-token steps through the cache, each 2 x N_matmul
    plus QK^T and AV against the positions cached so far."""
    p = prompt_len
    per_token = 2 * llama_params(a)["matmul"]
    prefill = per_token * p + 4 * a.layers * a.hidden * p * p
    cached = sum(range(p + 1, p + new_tokens))  # keys each decode step attends to
    return prefill + per_token * (new_tokens - 1) + 4 * a.layers * a.hidden * cached


def _llama_activations(a: "Arch", phase: str, batch: int, act_bytes: int, memory: str,
                       prompt_len: int, new_tokens: int) -> dict[str, float]:
    """Beyond the state (fxtrack.config.memory's docstring): training, per layer and token, the
    two norms' inputs and outputs, q, k, v, the attention output and the SwiGLU gate, up,
    activation and product (fused attention: no T x T scores) plus the fp32 logits, their
    softmax and its gradient; a forward, the logits; decoding, the KV cache."""
    head_dim = a.hidden // a.heads
    if phase == "decode":
        return {"KV cache": float(a.layers * 2 * batch * a.kv_heads * (prompt_len + new_tokens)
                                  * head_dim * act_bytes)}
    if phase == "forward":
        return {"logits": 4.0 * batch * a.seq_len * a.vocab_size}
    tokens = batch * a.seq_len
    kv_dim = a.kv_heads * head_dim
    block = (6 * a.hidden + 2 * kv_dim + 4 * a.mlp_dim) * tokens * act_bytes
    if memory == "checkpoint":  # block inputs, and one block recomputed at a time
        held = float(a.layers * a.hidden * tokens * act_bytes + block)
    else:
        held = float(a.layers * block)
    return {"activations": held, "logits": 4.0 * 3 * tokens * a.vocab_size}


def _byte_vocab(split: Any, model: str) -> int:
    if split.kind != "bytes":
        raise ValueError(f"data={split.name} holds {split.kind}; a {model} trains on a byte "
                         "corpus (data=pycode)")
    return int(split.classes)


def byte_dims(split: Any) -> dict[str, Any]:
    """A byte corpus sets the vocabulary (256); the sequence length stays the model's."""
    return {"vocab_size": _byte_vocab(split, "decoder LM")}


def masked_byte_dims(split: Any) -> dict[str, Any]:
    """A byte corpus sets a masked LM's vocabulary: its 256 bytes and the [MASK] past them
    (``BYTE_MASK_TOKEN``: no byte of the text reads as the mask)."""
    vocab = _byte_vocab(split, "masked LM")
    if vocab != BYTE_MASK_TOKEN:
        raise ValueError(f"data={split.name} has a vocabulary of {vocab}; the masked LM's "
                         f"[MASK] is byte id {BYTE_MASK_TOKEN}, past a 256-byte corpus")
    return {"vocab_size": BYTE_MASK_TOKEN + 1}


def next_token_windows(windows: Any, seeds: list) -> dict[str, Any]:
    """A decoder LM's batch of token windows (B, seq_len + 1), synthetic or a byte corpus':
    ``input_ids`` and ``labels`` (B, seq_len), the next token at every position (no
    randomness: ``seeds`` unused)."""
    return {"input_ids": windows[:, :-1], "labels": windows[:, 1:]}


def masked_byte_batch(windows: Any, seeds: list) -> dict[str, Any]:
    """A masked LM's batch of byte windows (B, seq_len + 1): the first seq_len bytes masked by
    ``mlm_masked`` with ``BYTE_MASK_TOKEN``, each row's draws from its own seed (``seeds``, one
    per row: fxtrack.data.batch's), so a row is masked the same way in every epoch and
    framework."""
    import numpy as np

    tokens = windows[:, :-1]
    draws = np.stack([np.random.default_rng(s).random(tokens.shape[1]) for s in seeds])
    return mlm_masked(tokens, draws, BYTE_MASK_TOKEN)


def _check_bert(name: str, d: dict[str, Any]) -> None:
    check_heads(d)
    if d["seq_len"] > d["max_position"]:
        raise ValueError(f"model.seq_len ({d['seq_len']}) exceeds the {d['max_position']} position embeddings")


def _check_llama(name: str, d: dict[str, Any]) -> None:
    check_heads(d)
    if d["heads"] % d["kv_heads"]:
        raise ValueError(f"model.heads ({d['heads']}) must be a multiple of model.kv_heads "
                         f"({d['kv_heads']}): each KV head serves a group of query heads")
    if (d["hidden"] // d["heads"]) % 2:
        raise ValueError(f"model.hidden / model.heads ({d['hidden'] // d['heads']}) must be "
                         "even: RoPE rotates pairs of channels")


def _seq_len(arch: "Arch") -> int:
    return arch.seq_len


# a language model's held-out figures (scenario.metric); the first is the default
CORPUS_METRICS = ("bits_per_byte", "loss")
_BERT_TINY = dict(layers=2, seq_len=16)
BERT_BASE = Model("bert", dict(layers=12, hidden=768, heads=12, mlp_dim=3072, seq_len=128,
                               vocab_size=30522, max_position=512, type_vocab=2),
                  gpu=(64, 50, 10), cpu=(4, 10, 2), tiny=_BERT_TINY, params=109_514_298,
                  display="BERT-base")
BERT_LARGE = Model("bert_large", dict(layers=24, hidden=1024, heads=16, mlp_dim=4096,
                                      seq_len=128, vocab_size=30522, max_position=512,
                                      type_vocab=2),
                   gpu=(32, 50, 10), cpu=(2, 5, 2), tiny=_BERT_TINY, params=335_174_458,
                   display="BERT-large")
_LLAMA_TINY = dict(layers=2, hidden=64, heads=4, kv_heads=2, mlp_dim=128, vocab_size=256,
                   seq_len=32)
LLAMA_1B = Model("llama", dict(layers=16, hidden=2048, heads=32, kv_heads=8, mlp_dim=8192,
                               vocab_size=128256, seq_len=2048, rope_theta=500000.0,
                               norm_eps=1e-5, tied_embeddings=True),
                 gpu=(8, 50, 10), cpu=(1, 5, 2), tiny=_LLAMA_TINY, params=1_235_814_400,
                 display="Llama (1B dims)")
LLAMA_8B = Model("llama_8b", dict(layers=32, hidden=4096, heads=32, kv_heads=8, mlp_dim=14336,
                                  vocab_size=128256, seq_len=2048, rope_theta=500000.0,
                                  norm_eps=1e-5, tied_embeddings=False),
                 gpu=(2, 50, 10), cpu=(1, 5, 2), tiny=_LLAMA_TINY, params=8_030_261_248,
                 display="Llama (8B dims)")

BERT = Family("bert", size_keys=("layers", "hidden", "heads", "mlp_dim", "seq_len", "vocab_size"),
              check=_check_bert, batch=_mlm_batch, describe=_mlm_shapes, forward_flops=_bert_flops,
              dataset="tokens", seq_len_search=True, data_dims=masked_byte_dims,
              corpus_batch=masked_byte_batch, converge_metrics=CORPUS_METRICS + ("accuracy",),
              quality=quality.BERT, attention_tokens=_seq_len, models=(BERT_BASE, BERT_LARGE))
LLAMA = Family("llama", size_keys=(*BERT.size_keys, "kv_heads"),
               check=_check_llama, batch=_next_token_batch, describe=_next_token_shapes,
               forward_flops=_llama_flops, generate_flops=_llama_generate_flops,
               params=lambda a: llama_params(a)["total"], activations=_llama_activations,
               memory_note="fused attention assumed", generates=True, seq_len_search=True,
               is_lm=lambda a: True, data_dims=byte_dims, corpus_batch=next_token_windows,
               converge_metrics=CORPUS_METRICS, quality=quality.LLAMA,
               attention_tokens=_seq_len, models=(LLAMA_1B, LLAMA_8B))
