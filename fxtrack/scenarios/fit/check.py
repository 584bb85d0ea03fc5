"""``scenario=fit`` before any work: the memory budget the search fits into, where the search
starts (from the pre-check's estimate), and the inputs it refuses, each in one line.

The budget: ``scenario.memory_gib`` when set; otherwise the memory the pre-check compares with
(``fxtrack.config.memory.available``: a GPU's total, a CPU host's MemTotal or cgroup limit).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from fxtrack import architectures, families
from fxtrack.architectures import Arch
from fxtrack.config import memory


@dataclasses.dataclass(frozen=True)
class Budget:
    bytes: Optional[float]  # None: no figure (a GPU without NVML): only the framework's OOM
    source: str


def budget(memory_gib: Optional[float], kind: Optional[str], devices: int,
           source: Callable[[Optional[str], int], Optional[memory.Available]] = memory.available
           ) -> Budget:
    """The budget one probe must stay under, per device."""
    if memory_gib is not None:
        return Budget(memory_gib * memory.GIB, "scenario.memory_gib")
    have = source(kind, devices)
    if have is None:
        return Budget(None, "the device's memory is not known: only the framework's own OOM counts")
    return Budget(have.bytes / have.shared_by, have.source)


def _estimate(arch: Arch, precision: str, batch: int, memory_lever: str,
              axis: str, value: int) -> Optional[memory.Estimate]:
    probed = arch if axis == "batch_size" else dataclasses.replace(
        arch, dims={**arch.dims, "seq_len": value})
    return memory.estimate(probed, "train", precision, value if axis == "batch_size" else batch,
                           memory=memory_lever)


def refusal(arch: Arch, axis: str, precision: str, batch: Optional[int], memory_lever: str,
            have: Budget, max_value: int) -> Optional[str]:
    """Why this fit search cannot start (one line), or None."""
    if axis == "seq_len" and not families.of(arch).seq_len_search:
        return (f"scenario.axis=seq_len searches a language model's sequence length; "
                f"model={arch.name} ({arch.family}) has none: use scenario.axis=batch_size")
    if have.bytes is None:
        return None
    gib = have.bytes / memory.GIB
    first = _estimate(arch, precision, batch or 1, memory_lever, axis, 1)
    if first is None:
        return None
    state = sum(v for k, v in first.parts.items() if k not in ("activations", "logits"))
    if state > have.bytes:
        return (f"model={arch.name}'s weights, gradients and optimiser state alone need "
                f"~{state / memory.GIB:.2f} GiB, more than the {gib:.2f} GiB budget "
                f"({have.source}) at any batch: raise scenario.memory_gib or shrink the model "
                "(size=tiny, parallel=fsdp)")
    if first.total > have.bytes:
        what = "batch_size=1" if axis == "batch_size" else "seq_len=1"
        return (f"the smallest probe ({what}) of model={arch.name} needs ~"
                f"{first.total / memory.GIB:.2f} GiB (the pre-check's floor), more than the "
                f"{gib:.2f} GiB budget ({have.source}): raise scenario.memory_gib")
    return None


def start_value(arch: Arch, axis: str, precision: str, batch: Optional[int], memory_lever: str,
                kind: Optional[str], have: Budget, max_value: int) -> int:
    """Where the search starts: the largest value whose estimate fits the budget where the
    estimate counts activations (decoder LMs), else the batch (or seq_len) the run would use."""
    if axis == "batch_size":
        fallback = batch or architectures.run_defaults(arch.name, kind or "gpu", None, None, None)[0]
    else:
        fallback = arch.seq_len
    one = _estimate(arch, precision, batch or 1, memory_lever, axis, 1)
    two = _estimate(arch, precision, batch or 1, memory_lever, axis, 2)
    if have.bytes is None or one is None or two is None or "activations" not in one.parts:
        return max(1, min(fallback, max_value))
    per = two.total - one.total
    fixed = one.total - per
    return max(1, min(int((have.bytes - fixed) // per) if per > 0 else fallback, max_value))


def check(conf: Any, arch: Arch) -> Optional[str]:
    """scenario=fit's own check before any work (its ``check`` part): why the search
    cannot start, or, for model=custom, a builder whose inputs ignore the batch_size the search
    varies (a shape-only build); None when it may start."""
    from fxtrack.config.validate import expected_device_kind

    s, kind = conf.scenario, expected_device_kind(conf.hardware.name)
    have = budget(s.memory_gib, kind, conf.devices)
    why = refusal(arch, s.axis, conf.precision.name, conf.batch_size, conf.memory.value, have,
                  s.max_batch)
    user = families.of(arch).user  # a built model: a shape-only build counts its parameters
    counter = None if user is None else user.abstract_count
    if why is not None or counter is None:
        return why
    from fxtrack.frameworks.declaration import import_path

    # a model a builder makes: whether the builder takes batch_size (a shape-only build says)
    _, why = import_path(counter)(conf, arch)
    return why.removeprefix("NotSupported: ") if "ignores batch_size" in why else None
