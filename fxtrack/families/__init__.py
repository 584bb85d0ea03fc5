"""The model-family registry: one typed spec per family (``Family``), registered once and looked
up by name, as torchtitan's ``ModelSpec``. Shared code asks the spec what a family is and does
(its batch, its FLOPs, its memory, whether it is a language model, which scenarios and levers
apply), never the family's name: a new family is one ``register`` call.

Imports no framework and nothing of fxtrack outside this package: the size accessor
(``fxtrack.architectures``) and every shared layer import it, so it sits below them all.

A family declares its models (``Model``: its named sizes, ``vit`` and ``vit_large``, their
per-device defaults, parameter counts and display names); ``fxtrack.architectures`` reads them
and nothing else. Running a family in a framework needs that framework's model
builder, which lives with the framework (``fxtrack/frameworks/<name>/models.py``'s ``BUILDERS``):
a spec names no framework, so the framework layers stay apart.
"""

from __future__ import annotations

from fxtrack.families.spec import Family, Model, get, models, names, of, register
from fxtrack.families import text, user, vision

for _family in (vision.RESNET, vision.VIT, text.BERT, text.LLAMA, user.CUSTOM):
    register(_family)

__all__ = ["Family", "Model", "get", "models", "names", "of", "register"]
