"""Synthetic, learnable batches from one seed, as NumPy arrays every framework copies to its device.

The same seed gives the same bytes in every framework, so parity tests can compare losses.
Images are a per-class prototype plus noise (the class is learnable from the pixels); BERT
sequences are arithmetic progressions of token ids with 15% of positions replaced by [MASK]
(a masked token is predictable from its neighbours); Llama sequences are such progressions too,
each position labelled with the next token (predictable from the two before it). Layout is
NHWC; PyTorch permutes.
"""

from __future__ import annotations

from typing import Any

from fxtrack.architectures import BERT_MASK_FRACTION, BERT_MASK_TOKEN, Arch

_FIRST_ORDINARY_TOKEN = 1000  # ids below are [PAD], [CLS], [MASK], unused... in BERT's vocabulary


def make_batch(arch: Arch, batch_size: int, seed: int) -> dict[str, Any]:
    """One batch: ``images`` (B, H, W, 3) float32 + ``labels`` (B,) int32 for vision models;
    ``input_ids`` (B, T) int32, ``mlm_labels`` (B, T) int32 and ``mlm_weights`` (B, T) float32
    (1 where the loss applies) for BERT; ``input_ids`` (B, T) and ``labels`` (B, T) int32 (the
    next token at every position; the loss is their mean cross-entropy) for a Llama."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if arch.family == "llama":
        tokens = progressions(rng, batch_size, arch.seq_len + 1, arch.vocab_size)
        return {"input_ids": tokens[:, :-1].astype(np.int32),
                "labels": tokens[:, 1:].astype(np.int32)}
    if arch.family == "bert":
        t, v = arch.seq_len, arch.vocab_size
        lo = min(_FIRST_ORDINARY_TOKEN, v // 2)
        start = rng.integers(lo, v, size=(batch_size, 1))
        stride = rng.integers(1, 8, size=(batch_size, 1))
        tokens = lo + (start - lo + stride * np.arange(t)) % (v - lo)
        masked = rng.random((batch_size, t)) < BERT_MASK_FRACTION
        masked[:, 0] = True  # at least one predicted position per sequence
        mask_token = BERT_MASK_TOKEN if BERT_MASK_TOKEN < v else 0
        return {
            "input_ids": np.where(masked, mask_token, tokens).astype(np.int32),
            "mlm_labels": tokens.astype(np.int32),
            "mlm_weights": masked.astype(np.float32),
        }
    s, c = arch.image_size, arch.num_classes
    labels = rng.integers(0, c, size=batch_size)
    prototypes = rng.standard_normal((c, 1, 1, 3)).astype(np.float32)
    noise = rng.standard_normal((batch_size, s, s, 3)).astype(np.float32)
    return {"images": prototypes[labels] + noise, "labels": labels.astype(np.int32)}


def progressions(rng: Any, batch_size: int, length: int, vocab_size: int) -> Any:
    """(batch_size, length) token ids, each row start + stride * i modulo the vocabulary, from
    a random start and a stride in 1..7 (``scenario=generate``'s prompts too: a trained model
    would continue them)."""
    import numpy as np

    start = rng.integers(0, vocab_size, size=(batch_size, 1))
    stride = rng.integers(1, 8, size=(batch_size, 1))
    return (start + stride * np.arange(length)) % vocab_size


def describe(arch: Arch, batch_size: int) -> dict[str, dict[str, Any]]:
    """What ``make_batch`` returns, without making it: each array's shape and dtype (for the
    run's dataset input in MLflow)."""
    if arch.family == "llama":
        t = [batch_size, arch.seq_len]
        return {"input_ids": {"shape": t, "dtype": "int32"},
                "labels": {"shape": t, "dtype": "int32"}}
    if arch.family == "bert":
        t = [batch_size, arch.seq_len]
        return {"input_ids": {"shape": t, "dtype": "int32"},
                "mlm_labels": {"shape": t, "dtype": "int32"},
                "mlm_weights": {"shape": t, "dtype": "float32"}}
    s = arch.image_size
    return {"images": {"shape": [batch_size, s, s, 3], "dtype": "float32"},
            "labels": {"shape": [batch_size], "dtype": "int32"}}
