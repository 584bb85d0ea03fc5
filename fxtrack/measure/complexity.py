"""Code complexity of each framework's implementation, counted by radon, per API dimension.

The comparison articles weigh developer effort by how much code each framework needs for each
part of the job; every framework's sub-package has the same files (or imports a shared module in
their place: ``SHARED``), so counting per file gives a like-for-like comparison. ``backend.py``
(the glue to fxtrack) counts in the totals only.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path
from typing import Optional

import fxtrack

# file name -> API dimension (inference.py, like backend.py, counts in the totals only)
DIMENSIONS = {"models.py": "model", "train.py": "train", "data.py": "data", "devices.py": "devices",
              "parallel.py": "devices", "checkpoint.py": "checkpoint", "serving.py": "checkpoint",
              "deployment.py": "checkpoint", "pipeline.py": "data"}

# Modules of fxtrack/frameworks/ that frameworks share (the Keras models and optimisers of
# framework=tensorflow and framework=keras) -> dimension: counted in every framework whose
# package imports them.
SHARED = {"keras_models.py": "model", "keras_train.py": "train"}

# model=custom: the framework's glue to a user's model (totals only), used instead of models.py
USER_MODEL = "user_model.py"


def _sources(root: Path) -> list[tuple[Path, Optional[str]]]:
    """The framework package's own files, then the shared modules it imports, with dimensions."""
    own = sorted(root.glob("*.py"))
    text = "\n".join(path.read_text() for path in own)
    shared = [root.parent / name for name in SHARED
              if re.search(rf"\bfxtrack\.frameworks(\.| import ){Path(name).stem}\b", text)]
    return [(p, DIMENSIONS.get(p.name)) for p in own] + [(p, SHARED[p.name]) for p in shared]


@functools.lru_cache(maxsize=None)
def code_metrics(framework: str, builder: Optional[str] = None) -> dict[str, float]:
    """``code_sloc``, ``code_lloc``, ``code_cc`` and the same per dimension (``code_sloc_model``).
    ``builder``: a user's model (``"package.module:function"``): its module is the ``model``
    dimension instead of fxtrack's own models, and ``user_model.py`` counts in the totals;
    without one, ``user_model.py`` is left out (fxtrack's own models never use it)."""
    from radon.raw import analyze
    from radon.visitors import ComplexityVisitor

    root = Path(fxtrack.__file__).resolve().parent / "frameworks" / framework
    files = [(p, dim) for p, dim in _sources(root)
             if (p.name != USER_MODEL if builder is None else dim != "model")]
    if builder is not None:
        files.append((builder_file(builder), "model"))
    totals: dict[str, float] = {}
    for path, dimension in files:
        source = path.read_text()
        raw = analyze(source)
        counts = {"sloc": raw.sloc, "lloc": raw.lloc,
                  "cc": ComplexityVisitor.from_code(source).total_complexity}
        for name, value in counts.items():
            totals[f"code_{name}"] = totals.get(f"code_{name}", 0) + value
            if dimension:
                key = f"code_{name}_{dimension}"
                totals[key] = totals.get(key, 0) + value
    return totals


def builder_file(builder: str) -> Path:
    """The source file of a builder's module, found without importing it (nor its framework)."""
    found = importlib.util.find_spec(builder.partition(":")[0])
    if found is None or not found.origin or not found.origin.endswith(".py"):
        raise ValueError(f"no Python source for the builder {builder!r}")
    return Path(found.origin)
