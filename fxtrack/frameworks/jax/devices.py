"""Device choice, memory counters and device tags for JAX."""

from __future__ import annotations

from typing import Optional

import jax


def _gpus() -> list[jax.Device]:
    """The GPUs JAX sees (none when jaxlib has no GPU backend)."""
    try:
        return jax.devices("gpu")
    except RuntimeError:  # no CUDA/ROCm backend in this jaxlib, or no device behind it
        return []


def select(hardware: str) -> jax.Device:
    """The device for ``hardware`` (auto | cpu | gpu); ``gpu`` without one raises."""
    if hardware in ("gpu", "auto"):
        gpus = _gpus()
        if gpus:
            return gpus[0]
        if hardware == "gpu":
            raise RuntimeError(
                f"hardware=gpu, but JAX sees no GPU (jax {jax.__version__}, backends: "
                f"{jax.default_backend()}); install a CUDA build, e.g. pip install 'jax[cuda12]'")
    return jax.devices("cpu")[0]


def kind(device: jax.Device) -> str:
    """``"cpu"`` or ``"gpu"``, the Backend's ``device_kind``."""
    return "cpu" if device.platform == "cpu" else "gpu"


def peak_memory_bytes(device: jax.Device) -> Optional[int]:
    """The allocator's peak (``memory_stats()['peak_bytes_in_use']``); None where the device
    keeps no statistics (CPU)."""
    stats = device.memory_stats()
    peak = (stats or {}).get("peak_bytes_in_use")
    return None if peak is None else int(peak)


def tags(device: jax.Device) -> dict[str, str]:
    """Device name (and CUDA / cuDNN versions on a GPU) for the run's tags."""
    if device.platform == "cpu":
        return {"device": "cpu"}
    out = {"device": device.device_kind, "jax_backend": device.platform}
    try:  # CUDA and cuDNN versions, where the CUDA plugin is installed
        from jax._src.lib import cuda_versions

        out["cuda"] = str(cuda_versions.cuda_runtime_get_version())
        out["cudnn"] = str(cuda_versions.cudnn_get_version())
    except Exception:  # noqa: BLE001 -- a private module: absent or changed is not an error
        pass
    return out
