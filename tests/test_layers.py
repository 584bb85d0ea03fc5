"""The import layers of pyproject.toml's ``[tool.importlinter]``: kept by this tree, and broken
(so the check can fail) by a back-edge like the one that once made a seven-module cycle."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter not installed "
                                "(pip install -e '.[test]')")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the fxtrack package under ``root`` with the repo's contracts."""
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"),
                           "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_package_keeps_its_import_contracts():
    proc = lint_imports(REPO)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_a_function_level_back_edge_breaks_them(tmp_path):
    shutil.copytree(REPO / "fxtrack", tmp_path / "fxtrack",
                    ignore=shutil.ignore_patterns("__pycache__"))
    records = tmp_path / "fxtrack" / "tracking" / "records.py"
    records.write_text(records.read_text() + "\n\ndef _back_edge():\n"
                       "    from fxtrack.orchestrator import job  # noqa: F401\n")
    proc = lint_imports(tmp_path)
    assert proc.returncode != 0
    assert "fxtrack.tracking.records -> fxtrack.orchestrator.job" in proc.stdout


@pytest.mark.parametrize("module, back_edge, broken", [
    # a scenario's worker-side modules stay off the orchestrator, though its folder holds a driver
    ("scenarios/serve/runner.py", "from fxtrack.orchestrator import job",
     "fxtrack.scenarios.serve.runner -> fxtrack.orchestrator.job"),
    ("scenarios/fit/__init__.py", "from fxtrack.config import memory",
     "fxtrack.scenarios.fit -> fxtrack.config.memory"),
    # each part is held to its own layer
    ("scenarios/serve/section.py", "from fxtrack.orchestrator import job",
     "fxtrack.scenarios.serve.section -> fxtrack.orchestrator.job"),
    ("scenarios/converge/check.py", "from fxtrack.tracking import records",
     "fxtrack.scenarios.converge.check -> fxtrack.tracking.records"),
    # and reached through Scenario.part alone
    ("orchestrator/app.py", "from fxtrack.scenarios.fit import driver",
     "fxtrack.orchestrator.app -> fxtrack.scenarios.fit.driver"),
])
def test_a_scenario_part_out_of_its_layer_breaks_them(tmp_path, module, back_edge, broken):
    """A scenario's folder holds modules of several layers (docs/extending.md): the contracts
    still hold each to its own."""
    shutil.copytree(REPO / "fxtrack", tmp_path / "fxtrack",
                    ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "fxtrack" / module
    path.write_text(path.read_text() + f"\n\ndef _back_edge():\n    {back_edge}  # noqa: F401\n")
    proc = lint_imports(tmp_path)
    assert proc.returncode != 0
    assert broken in proc.stdout, proc.stdout[-3000:]
