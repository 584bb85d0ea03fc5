"""A progress bar: tqdm when the interpreter has it (a framework-only venv may not), else lines."""

from __future__ import annotations

import sys
from typing import Any


class _Lines:
    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self.total, self.desc, self.enabled, self.n = total, desc, enabled, 0

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.enabled:
            print(f"{self.desc}: {self.n}/{self.total}", file=sys.stderr, flush=True)

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def close(self) -> None:
        pass


def progress(total: int, desc: str, enabled: bool = True) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return _Lines(total, desc, enabled)
    return tqdm(total=total, desc=desc, disable=not enabled, file=sys.stderr, dynamic_ncols=True,
                mininterval=0.5)
