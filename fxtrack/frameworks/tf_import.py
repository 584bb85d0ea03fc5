"""TensorFlow's import without the JAX imports two of its modules make for nothing fxtrack calls:
where JAX is installed, ``import tensorflow`` (and Keras on it) imported all of JAX too, 0.4 s of
a tiny run's wall and about 100 MB of its RSS (docs/measurements.md, "A sweep's end without the
claims' plans; TensorFlow without JAX"). No TensorFlow import here: the declarations'
``prepare_environment`` hooks call ``skip_optional_jax`` before it."""

from __future__ import annotations

import sys
from typing import Any, Optional

# The importers refused, each a ``try: import jax ... except ImportError`` whose fallback is
# harmless here. Any other ``import jax`` (a user's model, Keras on JAX) goes on as before.
IMPORTERS = {
    "tensorflow.lite.python.util": "its _jit stays None: only experimental_from_jax reads it",
    "keras.src.callbacks.orbax_checkpoint": "a shim for an older JAX's jax.monitoring",
}


class _RefuseOptionalJax:
    """A ``sys.meta_path`` finder that refuses ``jax`` to ``IMPORTERS`` only."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Optional[Any]:
        if name != "jax":
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
            frame = frame.f_back  # up through the import machinery to the importing module
        importer = frame.f_globals.get("__name__") if frame is not None else None
        if importer in IMPORTERS:
            raise ModuleNotFoundError(f"jax is not imported for {importer} (fxtrack)", name="jax")
        return None


def skip_optional_jax() -> None:
    """Refuse those optional JAX imports in this process (once; JAX imported already: nothing
    to save)."""
    if "jax" not in sys.modules and not any(isinstance(f, _RefuseOptionalJax) for f in sys.meta_path):
        sys.meta_path.insert(0, _RefuseOptionalJax())
