"""fxtrack's models against the well-known public implementation in the same framework, trained
side by side in one process with the same loop, batch, optimiser and precision, alternated over
rounds (ours, theirs, ours, theirs, ...), medians compared. A ratio >= 1 means fxtrack's model
trains at least as fast as the public one.

    pip install transformers          # the PyTorch references (built from configs, no download)
    python bench/reference.py [--rounds 3] [--only bert,vit,resnet50-keras]

References: Hugging Face ``BertForMaskedLM`` and ``ViTForImageClassification`` (PyTorch, SDPA
attention), ``keras.applications.ResNet50`` (TensorFlow; ResNet v1, whose stride sits on the
first 1x1 conv: ~3% fewer FLOPs than v1.5, so the ratio slightly flatters the reference).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

ROUNDS, WARMUP, STEPS = 3, 2, 8
# Small but real: full widths, 4 layers; BERT at 128 tokens, ViT and ResNet-50 at 128 pixels.
BERT = dict(layers=4, seq_len=128)
VIT = dict(layers=4, image_size=128)
BATCH = 8


def timed(step: Callable[[], None]) -> float:
    for _ in range(WARMUP):
        step()
    t0 = time.perf_counter()
    for _ in range(STEPS):
        step()
    return BATCH * STEPS / (time.perf_counter() - t0)


def torch_pair(name: str) -> tuple[Callable[[], None], Callable[[], None]]:
    import torch
    import torch.nn.functional as F
    import transformers as hf

    from fxtrack import architectures, synthetic
    from fxtrack.frameworks.torch import models, train

    torch.manual_seed(0)
    arch = architectures.resolve(name, **(BERT if name == "bert" else VIT))
    data = synthetic.make_batch(arch, BATCH, 0)
    if name == "bert":
        ref = hf.BertForMaskedLM(hf.BertConfig(num_hidden_layers=arch.layers, hidden_dropout_prob=0.0,
                                               attention_probs_dropout_prob=0.0),
                                 ).to(torch.float32)
        ids = torch.from_numpy(data["input_ids"]).long()
        labels = torch.where(torch.from_numpy(data["mlm_weights"]) > 0,
                             torch.from_numpy(data["mlm_labels"]).long(), -100)
        ref_loss = lambda: ref(input_ids=ids, labels=labels).loss  # noqa: E731
        batch = {"input_ids": ids, "mlm_labels": torch.from_numpy(data["mlm_labels"]).long(),
                 "mlm_weights": torch.from_numpy(data["mlm_weights"])}
    else:
        ref = hf.ViTForImageClassification(hf.ViTConfig(
            num_hidden_layers=arch.layers, image_size=arch.image_size, num_labels=1000,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
        x = torch.from_numpy(data["images"]).permute(0, 3, 1, 2).contiguous()
        y = torch.from_numpy(data["labels"]).long()
        ref_loss = lambda: F.cross_entropy(ref(pixel_values=x).logits, y)  # noqa: E731
        batch = {"images": x, "labels": y}
    ref.config._attn_implementation = "sdpa"
    ours = models.build(arch)
    opts = {m: train.optimizer(m, arch, torch.device("cpu")) for m in (ours, ref)}

    def step(model, loss_fn):
        def run():
            opts[model].zero_grad(set_to_none=True)
            loss_fn().backward()
            opts[model].step()
        return run

    return step(ours, lambda: train.loss_fn(ours, batch)), step(ref, ref_loss)


def keras_resnet_pair() -> tuple[Callable[[], None], Callable[[], None]]:
    import keras
    import tensorflow as tf

    from fxtrack import architectures, synthetic
    from fxtrack.frameworks import keras_models as models

    arch = architectures.resolve("resnet50", image_size=128)
    data = synthetic.make_batch(arch, BATCH, 0)
    x, y = tf.constant(data["images"]), tf.constant(data["labels"])
    ours = models.build(arch)
    ref = keras.applications.ResNet50(weights=None, input_shape=(128, 128, 3), classes=1000,
                                      classifier_activation=None)

    def step(model):
        opt = keras.optimizers.SGD(0.1, momentum=0.9)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function(jit_compile=False)
        def train():
            with tf.GradientTape() as tape:
                value = loss(y, model(x, training=True))
            opt.apply_gradients(zip(tape.gradient(value, model.trainable_variables),
                                    model.trainable_variables))
            return value

        return lambda: train().numpy()

    return step(ours), step(ref)


PAIRS = {"bert": lambda: torch_pair("bert"), "vit": lambda: torch_pair("vit"),
         "resnet50-keras": keras_resnet_pair}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--only", default=",".join(PAIRS))
    args = parser.parse_args()
    rows = []
    for name in args.only.split(","):
        ours_step, ref_step = PAIRS[name]()
        ours, ref = [], []
        for r in range(args.rounds):
            ours.append(timed(ours_step))
            ref.append(timed(ref_step))
            print(f"{name} round {r + 1}: fxtrack {ours[-1]:.2f}, reference {ref[-1]:.2f} samples/s",
                  flush=True)
        rows.append((name, statistics.median(ours), statistics.median(ref)))
    print(f"\nbatch {BATCH}, {STEPS} timed steps, fp32, eager, CPU; medians of {args.rounds} rounds")
    print(f"{'model':<15} {'fxtrack':>9} {'reference':>10} {'ratio':>7}")
    for name, ours, ref in rows:
        print(f"{name:<15} {ours:>9.2f} {ref:>10.2f} {ours / ref:>7.3f}")


if __name__ == "__main__":
    main()
