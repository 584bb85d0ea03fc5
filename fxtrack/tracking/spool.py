"""The local spool: a run's record is written here before logging and removed only after the
tracking server acknowledged the whole run, so a failure never loses a measurement."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

RECORD = "record.json"


def spool_dir() -> Path:
    """``$FXTRACK_HOME/spool``, by default ``~/.cache/fxtrack/spool``."""
    home = os.environ.get("FXTRACK_HOME") or Path.home() / ".cache" / "fxtrack"
    return Path(home) / "spool"


def write(record: dict[str, Any], artifacts: dict[str, Path | str]) -> Path:
    """Spool one run: ``record`` (JSON-able) plus artifact files (paths copied, strings written)."""
    entry = spool_dir() / record["result_id"]
    tmp = entry.with_name(entry.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "artifacts").mkdir(parents=True)
    for name, content in artifacts.items():
        target = tmp / "artifacts" / name
        if isinstance(content, Path):
            if content.exists():
                shutil.copyfile(content, target)
        else:
            target.write_text(content)
    (tmp / RECORD).write_text(json.dumps(record, indent=1))
    shutil.rmtree(entry, ignore_errors=True)
    tmp.rename(entry)  # atomic: a half-written entry is never seen as spooled
    return entry


def pending() -> Iterator[Path]:
    """Spooled entries, parents (sweeps) before their children, oldest first."""
    root = spool_dir()
    if not root.is_dir():
        return iter(())
    entries = [p for p in root.iterdir() if (p / RECORD).is_file()]
    return iter(sorted(entries, key=lambda p: (load(p).get("parent_result_id") is not None,
                                               (p / RECORD).stat().st_mtime)))


def load(entry: Path) -> dict[str, Any]:
    return json.loads((entry / RECORD).read_text())


def remove(entry: Path) -> None:
    shutil.rmtree(entry, ignore_errors=True)
