"""Bring your own model: one small MLP written in PyTorch, Keras and Flax NNX (models.py)."""
