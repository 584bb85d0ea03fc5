"""fxtrack: the same model, measured the same way, in PyTorch, TensorFlow and JAX.

Importing this package imports no deep-learning framework and no MLflow: each framework lives
in its own worker process (``python -m fxtrack.worker``), and only ``fxtrack.tracking`` talks
to MLflow.
"""

__version__ = "0.1.0"
