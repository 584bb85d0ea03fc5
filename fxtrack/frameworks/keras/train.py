"""The loss and Keras' own training step: ``model.compile`` + ``train_on_batch``."""

from __future__ import annotations

from typing import Union

import keras


def loss(weighted: bool) -> keras.losses.Loss:
    """Cross-entropy from the logits, in fp32 (a Keras loss computes in its own dtype, float32,
    whatever the compute dtype): the mean over the batch (images) or over every position (a
    Llama's next tokens), or for BERT's masked LM the mean over the predicted tokens (the
    mlm_weights passed as sample weights: ``weighted``, its builder's ``weighted_loss``)."""
    if weighted:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                          reduction="mean_with_sample_weight")
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def jit_compile(request: str) -> Union[bool, str]:
    """``framework.compile`` as compile()'s argument: auto is Keras' own "auto"."""
    return "auto" if request == "auto" else request == "true"


def compile_model(model: keras.Model, opt: keras.optimizers.Optimizer,
                  loss_fn: keras.losses.Loss, request: str) -> bool:
    """``model.compile`` with fxtrack's optimiser and a loss (``loss(weighted)``, or a user's
    model's), no metrics; returns whether the step is compiled, as Keras resolved it
    (``model.jit_compile``)."""
    model.compile(optimizer=opt, loss=loss_fn, jit_compile=jit_compile(request))
    return bool(model.jit_compile)
