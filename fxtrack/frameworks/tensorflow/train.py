"""Optimiser, loss and the training step for TensorFlow (Keras policies, loss scaling, XLA)."""

from __future__ import annotations

from typing import Callable

import keras
import tensorflow as tf
from keras import ops

# The optimisers and dtype policies are Keras' alone, shared with framework=keras.
from fxtrack.frameworks.keras_train import optimizer, precision_policy  # noqa: F401

# What ``ops.dot_product_attention`` runs on the TensorFlow backend (Keras 3.x): a composite of
# einsums and a softmax that XLA (or the tf.function graph) fuses as it can; Keras' flash path
# is JAX/torch-only. The ``fxtrack.attention`` tag.
ATTENTION = "keras.ops.dot_product_attention:composite"
# The Llama's: the causal mask in the same composite, and the grouped KV heads repeated to the
# query heads by Keras' TensorFlow backend before the einsums (it has no grouped path).
LLAMA_ATTENTION = f"{ATTENTION}:causal:gqa-kv-repeated"


def loss_fn(model: keras.Model, batch: dict[str, tf.Tensor], training: bool = True) -> tf.Tensor:
    """Mean cross-entropy (images), masked-LM cross-entropy averaged over predicted tokens
    (BERT), or next-token cross-entropy averaged over every position (Llama); logits and loss
    in fp32 whatever the compute dtype."""
    if "images" in batch:
        logits = ops.cast(model(batch["images"], training=training), "float32")  # (B, classes)
        return ops.mean(ops.sparse_categorical_crossentropy(batch["labels"], logits,
                                                            from_logits=True))
    logits = ops.cast(model(batch["input_ids"], training=training), "float32")  # (B, T, vocab)
    if "mlm_labels" not in batch:  # a decoder LM: ``labels`` is the next token everywhere
        return ops.mean(ops.sparse_categorical_crossentropy(batch["labels"], logits,
                                                            from_logits=True))
    ce = ops.sparse_categorical_crossentropy(batch["mlm_labels"], logits, from_logits=True)
    w = batch["mlm_weights"]  # (B, T), 1 where the token is predicted
    return ops.sum(ce * w) / ops.sum(w)


def apply_gradients(opt: keras.optimizers.Optimizer, grads: list, variables: list) -> None:
    """``opt.apply`` on dense gradients. Embedding gradients arrive as ``IndexedSlices`` with
    repeated rows (BERT's token-type table: every token reads row 0); Keras' sparse update path
    applies the moment decay once per repeat, unlike torch's dense update, so the slices are
    summed into a dense tensor first (cheap: the word-embedding gradient is dense already,
    through the tied decoder)."""
    opt.apply([tf.convert_to_tensor(g) for g in grads], variables)


def make_step(model: keras.Model, opt: keras.optimizers.Optimizer,
              strategy: tf.distribute.Strategy, jit_compile: bool,
              loss: Callable[..., tf.Tensor] = loss_fn) -> Callable[[dict[str, tf.Tensor]], tf.Tensor]:
    """One training step as a ``tf.function`` taking a batch (per-replica under a distribution
    strategy): forward, (scaled) backward, optimiser update on every replica; returns the loss
    averaged over the replicas (a tensor, not yet fetched). Build it under
    ``parallel.placement``: the optimiser slots are created here.

    ``jit_compile``: on one device XLA compiles the whole step; on several, XLA compiles each
    replica's forward and backward, and the all-reduce and update run outside it (an XLA
    cluster lives on one device and cannot reach the other replicas' variables).

    A TensorFlow limit, measured: the share of the step spent in the gradient all-reduce and
    the optimiser update (step time with ``apply_gradients`` vs without), 2 logical CPU
    replicas, batch 4 per replica, tf.function, median of 4 rounds of 5 steps on a shared 2-core
    machine (contended): tiny ViT (AdamW, 15.5 M params) 2% (557 vs 547 ms); ResNet-50 at
    32 px (SGD, 25.6 M params) 15% (834 vs 713 ms). Keras' optimiser applies the update per
    variable outside any fused kernel; fusing it would mean a hand-written cross-replica XLA
    step, which tf.distribute does not offer for MirroredStrategy."""
    variables = model.trainable_variables
    opt.build(variables)  # create slots eagerly: a tf.function may not create variables later
    replicas = strategy.num_replicas_in_sync

    def gradients(batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, list]:
        with tf.GradientTape() as tape:
            value = loss(model, batch, training=True)  # mean over this replica's batch
            # Keras' optimiser all-reduces the replicas' gradients by SUM: 1/N makes the mean.
            # (x / 1.0 is exact: one device computes bit for bit what it did without this.)
            scaled = opt.scale_loss(value / replicas)  # * loss scale under LossScaleOptimizer
        return value, tape.gradient(scaled, variables)

    if replicas > 1:
        gradients = tf.function(gradients, jit_compile=jit_compile)

    def replica_step(batch: dict[str, tf.Tensor]) -> tf.Tensor:
        loss, grads = gradients(batch)
        apply_gradients(opt, grads, variables)  # LossScaleOptimizer: unscale, skip if not finite
        return loss

    @tf.function(jit_compile=jit_compile and replicas == 1)
    def step(batch: dict[str, tf.Tensor]) -> tf.Tensor:
        losses = strategy.run(replica_step, args=(batch,))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    return step


def make_inference_step(model: keras.Model, batch: dict[str, tf.Tensor],
                        jit_compile: bool) -> Callable[[], tf.Tensor]:
    """Forward only, in inference mode (BatchNorm running statistics), under the model's dtype
    policy as in training; returns the logits, left on the device."""
    x = batch["images"] if "images" in batch else batch["input_ids"]

    @tf.function(jit_compile=jit_compile)
    def forward() -> tf.Tensor:
        return model(x, training=False)

    return forward
