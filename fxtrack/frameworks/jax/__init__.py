"""JAX: Flax NNX models, ``jax.nn.dot_product_attention``, Optax, a pure ``jax.jit`` train step."""
