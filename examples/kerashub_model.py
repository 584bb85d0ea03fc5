"""A keras-hub model on fxtrack's Keras path (framework=tensorflow now, framework=keras later):
a GPT-2 backbone built from explicit arguments (no preset, nothing downloaded), with a
language-model head tied to its token embedding, trained on next-token prediction.

    python -m fxtrack framework=tensorflow model=custom \\
        model.keras=kerashub_model:build_keras hardware=cpu

(run from examples/, or with examples/ on PYTHONPATH; ``model.kwargs.layers=12
model.kwargs.hidden=768 ...`` for GPT-2 small's sizes). Needs ``pip install 'fxtrack[byom-examples]'``.
"""

from __future__ import annotations

import numpy as np


def build_keras(batch_size: int, seed: int, layers: int = 2, hidden: int = 64, heads: int = 2,
                seq_len: int = 32, vocab: int = 512):
    import keras
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocab, num_layers=layers, num_heads=heads, hidden_dim=hidden,
        intermediate_dim=4 * hidden, max_sequence_length=seq_len, dropout=0.0)
    # logits through the tied token embedding, as keras_hub's GPT2CausalLM does
    logits = backbone.token_embedding(backbone.output, reverse=True)
    model = keras.Model(backbone.input, logits)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (batch_size, seq_len + 1), dtype=np.int32)
    inputs = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((batch_size, seq_len), bool)}

    def loss(out, targets):
        return keras.ops.mean(keras.ops.sparse_categorical_crossentropy(
            targets, keras.ops.cast(out, "float32"), from_logits=True))

    return model, (inputs, tokens[:, 1:]), loss


def build_bert_keras(batch_size: int, seed: int, layers: int = 2, hidden: int = 32,
                     heads: int = 2, seq_len: int = 16, vocab: int = 256, classes: int = 3,
                     dropout: float = 0.1):
    """A keras-hub BERT backbone with Dropout (its seed generator is a variable every training
    step updates) and a classification head on the pooled output."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=vocab, num_layers=layers, num_heads=heads, hidden_dim=hidden,
        intermediate_dim=4 * hidden, max_sequence_length=seq_len, dropout=dropout)
    head = keras.layers.Dropout(dropout)(backbone.output["pooled_output"])
    model = keras.Model(backbone.input, keras.layers.Dense(classes)(head))
    rng = np.random.default_rng(seed)
    inputs = {"token_ids": rng.integers(0, vocab, (batch_size, seq_len), dtype=np.int32),
              "segment_ids": np.zeros((batch_size, seq_len), np.int32),
              "padding_mask": np.ones((batch_size, seq_len), bool)}
    labels = rng.integers(0, classes, (batch_size,), dtype=np.int32)

    def loss(out, targets):
        return keras.ops.mean(keras.ops.sparse_categorical_crossentropy(
            targets, keras.ops.cast(out, "float32"), from_logits=True))

    return model, (inputs, labels), loss
