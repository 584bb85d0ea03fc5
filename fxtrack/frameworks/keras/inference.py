"""The inference capability: Keras' own forward path, ``predict_on_batch``, on the resident
batch: inference mode (BatchNorm running statistics), compiled as the model's step is
(``model.jit_compile``). Keras returns the outputs as NumPy, so every step includes their copy
to the host (large for BERT's (B, T, vocab) logits); that copy is also what makes it synced."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # annotations only (the backend does not import this module)
    from fxtrack.frameworks.keras.backend import KerasBackend


def prepare(backend: KerasBackend) -> Callable[[], None]:
    """A forward-only step of the built model (``KerasBackend.build``) on its resident batch."""
    model, x = backend.model, backend.x

    def step() -> None:
        model.predict_on_batch(x)

    return step
