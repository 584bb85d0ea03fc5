"""model=custom checked before any work (the levers a user's model cannot take are a rule of
fxtrack.scenarios.rules): this framework's builder set, and its module importable by the
worker's interpreter, found with ``importlib.util.find_spec`` (no framework imported), so that a
typo is refused in one line within seconds.

Each refusal is a ``CellNotSupported``: a single run exits 2 with its line; a sweep skips that
cell as not supported, with the reason, and runs the others."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Optional

from fxtrack.architectures import Arch
from fxtrack.frameworks import user_builder
from fxtrack.frameworks.declaration import NotSupported, declaration

_FIND = ("import importlib.util, sys\n"
         "try:\n    found = importlib.util.find_spec(sys.argv[1]) is not None\n"
         "except (ImportError, ValueError):\n    found = False\n"
         "sys.exit(0 if found else 3)")


class CellNotSupported(ValueError):
    """A config whose framework has no path for a user's model: one line, no work started
    (``fxtrack.config.validate`` raises it as a Refused: a sweep skips the cell)."""


def check(conf: Any, arch: Arch) -> None:
    """Raise CellNotSupported with the one-line reason, or return when the cell can run."""
    if arch.family != "custom":
        return
    framework = declaration(conf.framework.package)
    if not framework.has("user_model"):
        raise CellNotSupported(str(framework.unsupported("user_model", "model=custom")))
    try:
        path = user_builder.builder_path(arch, framework)
    except NotSupported as e:
        raise CellNotSupported(str(e)) from None
    missing = missing_module(path, conf.framework.python)
    if missing:
        raise CellNotSupported(f"model.{framework.builder_key}={path}: {missing}")


def missing_module(path: str, python: Optional[str]) -> Optional[str]:
    """Why the builder's module is not importable by the worker's interpreter (``python``, or
    this one), or None."""
    if not python or os.path.realpath(python) == os.path.realpath(sys.executable):
        return user_builder.missing_module(path)
    module = path.partition(":")[0]
    try:
        found = subprocess.run([python, "-c", _FIND, module], capture_output=True,
                               timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot ask framework.python={python} for module {module!r}: {e}"
    return None if found else (f"no module named {module!r} is importable by {python} "
                               "(is it on PYTHONPATH?)")
