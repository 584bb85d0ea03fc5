"""The synthetic batch as Keras' ``fit``-style (x, y, sample_weight), on the device in the
backend's own tensors (NHWC images, int32 ids), so train_on_batch copies nothing per step."""

from __future__ import annotations

from typing import Any, Optional

import keras

from fxtrack.architectures import Arch
from fxtrack.data.synthetic import make_batch


def device_batch(arch: Arch, batch_size: int, seed: int) -> tuple[Any, Any, Optional[Any]]:
    """``fxtrack.data.synthetic.make_batch`` copied once onto the backend's default device (the one
    ``devices.select`` named): images and labels, BERT's token ids, masked-LM labels and the
    weights of the predicted tokens, or a Llama's token ids and next tokens (every position
    counts: no weights)."""
    batch = make_batch(arch, batch_size, seed)
    return fit_form({key: keras.ops.convert_to_tensor(value) for key, value in batch.items()})


def fit_form(batch: dict[str, Any]) -> tuple[Any, Any, Optional[Any]]:
    """A batch (fxtrack.data.synthetic's keys, any arrays) as (x, y, sample_weight)."""
    if "images" in batch:
        return batch["images"], batch["labels"], None
    if "mlm_labels" not in batch:
        return batch["input_ids"], batch["labels"], None
    return batch["input_ids"], batch["mlm_labels"], batch["mlm_weights"]
