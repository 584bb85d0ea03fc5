"""The compile-mode cache: the pick of each finished ``framework.compile=tune`` decision, so that a
later ``framework.compile=auto`` run of the same configuration uses that measured choice instead of
the framework's table row (the row is a guess at sizes it was not measured at).

Kept beside the peak-FLOP cache (``compile_tuned.json`` in the same directory), keyed by the same
machine identity (CPU model, threads, device) plus framework, model family, the model's size keys,
precision, batch size and torch.compile mode. Written by the worker that tuned (its first process
only), read by the worker before it builds and by ``fxtrack doctor``. A file that cannot be read is
ignored with a warning: the table decides then."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Optional

from filelock import FileLock, Timeout

from fxtrack.measure import peak

LOCK_TIMEOUT_S = 30  # another process writing longer: this pick goes uncached, the run goes on


def cache_path() -> Path:
    return peak.cache_path().with_name("compile_tuned.json")


def cache_key(device: str, threads: int, framework: str, family: str, dims: Mapping[str, Any],
              precision: str, batch: int, settings: Mapping[str, Any] | None = None) -> str:
    """The machine as the peak cache names it, then what decides a compile mode's speed (the
    framework's own settings included: a ``max-autotune`` tune can pick differently)."""
    machine = f"{peak.cpu_model()}|{threads} threads|{device}"
    sizes = json.dumps(dict(dims), sort_keys=True, separators=(",", ":"))
    return (f"{machine}|{framework}|{family}|{sizes}|{precision}|batch {batch}"
            f"|settings {json.dumps(dict(settings or {}), sort_keys=True, separators=(',', ':'))}")


def cached() -> dict[str, dict[str, Any]]:
    """{key: {"compiled", "figures", "date"}}; a corrupt file (or entries of another layout) is
    ignored with a warning on stderr."""
    path = cache_path()
    if not path.exists():
        return {}
    try:
        cache = json.loads(path.read_text())
        if not isinstance(cache, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        print(f"[fxtrack] WARNING: ignoring the compile-mode cache {path} ({e}); "
              "framework.compile=auto uses the table", file=sys.stderr, flush=True)
        return {}
    return {k: v for k, v in cache.items()
            if isinstance(v, dict) and isinstance(v.get("compiled"), bool)}


def lookup(key: str) -> Optional[dict[str, Any]]:
    return cached().get(key)


def record(key: str, compiled: bool, figures: str) -> bool:
    """Store a tune pick under ``key`` (atomic replace; readers take no lock). False when the
    lock was not had in time (the pick is not cached)."""
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"compiled": compiled, "figures": figures,
             "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}
    try:
        with FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
            cache = cached()
            cache[key] = entry
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(cache, indent=1))
            tmp.replace(path)
    except Timeout:
        return False
    return True
