"""model=custom checked before any work (the levers a user's model cannot take are a rule of
fxtrack.scenarios.rules): this framework's builder set, and its module importable by the
worker's interpreter, found with ``importlib.util.find_spec`` (no framework imported), so that a
typo is refused in one line within seconds.

Each refusal is a ``CellNotSupported``: a single run exits 2 with its line; a sweep skips that
cell as not supported, with the reason, and runs the others."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import fxtrack
from fxtrack.architectures import Arch
from fxtrack.environment import worker_environment
from fxtrack.frameworks import user_builder
from fxtrack.frameworks.declaration import NotSupported, declaration
from fxtrack.worker.protocol import JobSpec

_FIND = ("import importlib.util, sys\n"
         "try:\n    found = importlib.util.find_spec(sys.argv[1]) is not None\n"
         "except (ImportError, ValueError):\n    found = False\n"
         "sys.exit(0 if found else 3)")


class CellNotSupported(ValueError):
    """A config whose framework has no path for a user's model: one line, no work started
    (``fxtrack.config.validate`` raises it as a Refused: a sweep skips the cell)."""


def refusal(conf: Any, arch: Arch) -> Optional[str]:
    """The family's config check (``UserModel.config_check``): why this cell cannot run (levers,
    builder unset, module not importable), one line, or None."""
    try:
        check(conf, arch)
    except CellNotSupported as e:
        return str(e)
    return None


def check(conf: Any, arch: Arch) -> None:
    """Raise CellNotSupported with the one-line reason, or return when the cell can run."""
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


PROBE_TIMEOUT_S = 300  # a framework's import on a loaded machine, and a shape-only build


def abstract_param_count(conf: Any, arch: Arch) -> tuple[Optional[int], str]:
    """(trainable parameters, "") of the user's model from a shape-only build (torch ``meta``,
    a Keras ``StatelessScope``, ``nnx.eval_shape``: nothing allocated) in a short worker,
    ``python -m fxtrack.worker --params``, under the run's interpreter, so that no framework
    is imported here; (None, why) where it cannot be counted (the check is then skipped and
    the run's worker reports any builder error). Asked once per model and framework in this
    process (a sweep's repeats and scenarios share the answer)."""
    framework = declaration(conf.framework.package)
    settings = {key: getattr(conf.framework, key) for key in framework.settings}
    spec = JobSpec(result_id="params", framework=conf.framework.name,
                   package=conf.framework.package, scenario="params", runner="",
                   arch=arch.to_json(), precision=conf.precision.name, hardware="cpu",
                   devices=1, compile=False, seed=conf.seed, batch_size=1, steps=None,
                   warmup_steps=None, result_path="", framework_settings=settings)
    # hardware=cpu: the build is abstract, no device is needed (nor initialised)
    return _probe(conf.framework.python or sys.executable,
                  json.dumps(dataclasses.asdict(spec), sort_keys=True))


@functools.lru_cache(maxsize=64)
def _probe(python: str, spec_json: str) -> tuple[Optional[int], str]:
    with tempfile.TemporaryDirectory(prefix="fxtrack-params-") as tmp:
        path = Path(tmp) / "spec.json"
        path.write_text(spec_json)
        env = worker_environment(os.environ)
        root = str(Path(fxtrack.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        try:
            out = subprocess.run([python, "-m", "fxtrack.worker", "--params", str(path)],
                                 capture_output=True, text=True, env=env,
                                 timeout=PROBE_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"the parameter probe did not run: {e}"
    try:
        answer = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return None, f"the parameter probe gave no answer (exit {out.returncode})"
    if "param_count" not in answer:
        return None, str(answer.get("error", answer))
    return int(answer["param_count"]), ""
