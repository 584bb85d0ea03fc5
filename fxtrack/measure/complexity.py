"""Code complexity of each framework's implementation, counted by radon, per API dimension.

The comparison articles weigh developer effort by how much code each framework needs for each
part of the job; every framework's sub-package has the same files (or imports a shared module in
their place: ``SHARED``), so counting per file gives a like-for-like comparison. ``backend.py``
(the glue to fxtrack) counts in the totals only.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import fxtrack

# file name -> API dimension (inference.py, like backend.py, counts in the totals only)
DIMENSIONS = {"models.py": "model", "train.py": "train", "data.py": "data", "devices.py": "devices",
              "parallel.py": "devices", "checkpoint.py": "checkpoint", "serving.py": "checkpoint",
              "deployment.py": "checkpoint", "pipeline.py": "data"}

# Modules of fxtrack/frameworks/ that frameworks share (the Keras models and optimisers of
# framework=tensorflow and framework=keras) -> dimension: counted in every framework whose
# package imports them.
SHARED = {"keras_models.py": "model", "keras_train.py": "train"}


def _sources(root: Path) -> list[Path]:
    """The framework package's own files, then the shared modules it imports."""
    own = sorted(root.glob("*.py"))
    text = "\n".join(path.read_text() for path in own)
    shared = [root.parent / name for name in SHARED
              if re.search(rf"\bfxtrack\.frameworks(\.| import ){Path(name).stem}\b", text)]
    return own + shared


@functools.lru_cache(maxsize=None)
def code_metrics(framework: str) -> dict[str, float]:
    """``code_sloc``, ``code_lloc``, ``code_cc`` and the same per dimension (``code_sloc_model``)."""
    from radon.raw import analyze
    from radon.visitors import ComplexityVisitor

    root = Path(fxtrack.__file__).resolve().parent / "frameworks" / framework
    totals: dict[str, float] = {}
    for path in _sources(root):
        source = path.read_text()
        raw = analyze(source)
        counts = {"sloc": raw.sloc, "lloc": raw.lloc,
                  "cc": ComplexityVisitor.from_code(source).total_complexity}
        dimension = DIMENSIONS.get(path.name) or SHARED.get(path.name)
        for name, value in counts.items():
            totals[f"code_{name}"] = totals.get(f"code_{name}", 0) + value
            if dimension:
                key = f"code_{name}_{dimension}"
                totals[key] = totals.get(key, 0) + value
    return totals
