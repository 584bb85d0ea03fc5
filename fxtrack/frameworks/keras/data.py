"""The synthetic batch as Keras' ``fit``-style (x, y, sample_weight), on the device in the
backend's own tensors (NHWC images, int32 ids), so train_on_batch copies nothing per step."""

from __future__ import annotations

from typing import Any, Optional

import keras

from fxtrack.architectures import Arch
from fxtrack.synthetic import make_batch


def device_batch(arch: Arch, batch_size: int, seed: int) -> tuple[Any, Any, Optional[Any]]:
    """``fxtrack.synthetic.make_batch`` copied once onto the backend's default device (the one
    ``devices.select`` named): images and labels, BERT's token ids, masked-LM labels and the
    weights of the predicted tokens, or a Llama's token ids and next tokens (every position
    counts: no weights)."""
    batch = make_batch(arch, batch_size, seed)
    on_device = {key: keras.ops.convert_to_tensor(value) for key, value in batch.items()}
    if "images" in on_device:
        return on_device["images"], on_device["labels"], None
    if "mlm_labels" not in on_device:
        return on_device["input_ids"], on_device["labels"], None
    return on_device["input_ids"], on_device["mlm_labels"], on_device["mlm_weights"]
