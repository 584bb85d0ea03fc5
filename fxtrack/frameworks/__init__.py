"""One sub-package per framework. Its ``__init__.py`` declares the framework
(``FRAMEWORK = declaration.Framework(...)``: Backend class, compile rules and tags, settings,
environment, capabilities and why any is absent) and imports no framework, so the orchestrator
and the report read it freely. The rest only the worker imports, and only its own framework's:
``backend.py`` (the Backend: the small contract in ``base.py``), ``models.py``, ``train.py``,
``data.py``, ``devices.py``, ``parallel.py``, and one module per declared capability
(``inference.py``, ``pipeline.py``, ``checkpoint.py``, ``serving.py``, ``deployment.py``).
The Keras-based frameworks (tensorflow, keras) share ``keras_models.py`` and ``keras_train.py``
in place of their own models and optimisers, so that neither imports the other."""
