"""One sub-package per framework, each with the same files: ``models.py`` (model definitions),
``train.py`` (optimiser and training step), ``data.py`` (synthetic data onto the device),
``devices.py`` (device choice, memory, parallelism) and ``backend.py`` (the Backend the worker
runs). Only the worker imports them, and only its own framework's. The Keras-based frameworks
(tensorflow, keras) share ``keras_models.py`` in place of their own ``models.py``, so that
neither imports the other."""
