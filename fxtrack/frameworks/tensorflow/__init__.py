"""TensorFlow: Keras 3 functional models, ``tf.GradientTape`` steps in ``tf.function`` (XLA
with ``jit_compile``), Keras mixed-precision policies and loss scaling."""
