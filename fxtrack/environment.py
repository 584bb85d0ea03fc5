"""Facts about the host and software behind a run, read without importing any framework.

Both the MLflow writer and the ``mlflow.run_context_provider`` plugin take their tags from here.
Every reader is best-effort: a fact that cannot be read is left out, never guessed.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit, urlunsplit

import fxtrack

SECRET_NAME = re.compile(r"PASSWORD|PASSWD|TOKEN|SECRET|KEY|CREDENTIAL|AUTH", re.IGNORECASE)
_ENV_PREFIXES = ("CUDA_", "NVIDIA_", "XLA_", "JAX_", "TF_", "TORCH", "OMP_", "MKL_", "MLFLOW_",
                 "FXTRACK_", "HYDRA_", "SLURM_")


def redact_uri(uri: str) -> str:
    """A URI with any user:password@ removed, safe to log."""
    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def redact_uri_text(text: str) -> str:
    """``text`` with any ``scheme://user:password@`` credentials removed."""
    return re.sub(r"(\w+://)[^/@\s]+@", r"\1", text)


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _git_commit() -> str:
    repo = Path(fxtrack.__file__).resolve().parent.parent
    out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                         text=True, timeout=5, check=True)
    return out.stdout.strip()


def _nvidia_driver() -> str:
    """The NVIDIA kernel driver's version, from procfs (no NVML import, no GPU context)."""
    text = Path("/proc/driver/nvidia/version").read_text()
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", text)
    return match.group(1) if match else ""


_READERS: dict[str, Callable[[], str]] = {
    "fxtrack.cpu": _cpu_model,
    "fxtrack.host": platform.node,
    "fxtrack.python": platform.python_version,
    "fxtrack.version": lambda: fxtrack.__version__,
    "fxtrack.git_commit": _git_commit,
    "fxtrack.driver": _nvidia_driver,
}


@functools.lru_cache(maxsize=1)
def host_tags() -> dict[str, str]:
    """Hardware/software tags of this host (DESIGN.md section 5); unreadable facts are dropped."""
    tags = {}
    for key, read in _READERS.items():
        try:
            value = read()
        except Exception:  # noqa: BLE001 - a fact we cannot read is simply absent
            continue
        if value:
            tags[key] = str(value)[:5000]
    return tags


def environment_snapshot() -> dict[str, object]:
    """What goes into environment.json: host facts and relevant variables, secrets removed."""
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith(_ENV_PREFIXES) and not SECRET_NAME.search(k)}
    if "MLFLOW_TRACKING_URI" in env:
        env["MLFLOW_TRACKING_URI"] = redact_uri(env["MLFLOW_TRACKING_URI"])
    return {"host": host_tags(), "platform": platform.platform(), "environment": env}
