"""The memory pre-check: a config whose run cannot fit the device's memory stops before any
worker builds it (``fxtrack.config.validate`` raises ``WontFit``; a sweep skips the cell).

The estimate comes from the model's declared dims, not from building the model (a user's model,
model=custom: from the parameters of a shape-only build, counted by a short worker,
``fxtrack.config.user_model.abstract_param_count``), and is a floor: what the run must hold at
the least, so that a refusal is never a guess.

- Training state per parameter: fp32 weights 4 B + fp32 gradients 4 B + the optimiser's state
  (AdamW: two fp32 moments, 8 B; SGD with momentum: 4 B). Every framework here keeps fp32 master
  weights under bf16 / fp16 (torch autocast, Keras mixed policies, JAX's fp32 parameters cast
  per step), plus a compute-dtype copy of the weights (2 B) while it runs. ``parallel=fsdp``
  divides the state and the copy (not the activations) by the devices it shards over.
- Activations kept for the backward pass (decoder LMs; other families: state only): per layer
  and token, the two norms' inputs and outputs, q, k, v, the attention output, and the SwiGLU
  gate, up, activation and product, i.e. ``6 hidden + 2 kv_dim + 4 mlp_dim`` values in the
  compute dtype; a fused attention is assumed (no T x T scores held). ``memory=checkpoint``
  keeps only each block's input plus one block's activations. The logits:
  ``batch x seq_len x vocab x 4 B x 3`` (fp32 logits, their softmax and its gradient).
- Inference: the weights (+ the copy) and the logits; generate: the weights and the KV cache.

Compared with the device's memory: a GPU's total (NVML, the smallest of the run's devices), or
on a CPU the machine's MemTotal or its cgroup limit where lower, which every device process of
the host shares. ``FXTRACK_MEMORY_GIB`` replaces that figure (tests; ``off`` skips the check).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable, Optional

from fxtrack import architectures, families, scenarios
from fxtrack.architectures import Arch

GIB = 2**30
MEMORY_ENV = "FXTRACK_MEMORY_GIB"
MIXED = ("bf16", "fp16")  # compute in 2-byte floats, fp32 master weights
OPTIMISER_BYTES = {"adamw": 8, "sgd": 4}  # per parameter: AdamW's m and v; SGD's momentum


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Bytes one device needs, by part (insertion order is the message's), and what part of
    it is sharded state (what ``parallel=fsdp`` divides)."""

    parts: dict[str, float]
    sharded_state: float  # the training state before sharding, for the message
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> float:
        return sum(self.parts.values())


@dataclasses.dataclass(frozen=True)
class Available:
    """The memory a run's devices have: ``bytes`` per device, shared by ``shared_by`` device
    processes (a CPU host's devices share its RAM; a GPU is its own), and where it was read."""

    bytes: float
    source: str
    shared_by: int = 1


def param_count(arch: Arch) -> Optional[int]:
    """Parameters from the table: from the dims where the family has a formula (a Llama's),
    another family's only at its canonical size (its Model's params); None where unknown (a resized
    ResNet/BERT/ViT, a user's model): then the check is skipped."""
    formula = families.of(arch).params
    if formula is not None:
        return formula(arch)
    return architectures.param_count(arch.name) if arch.canonical else None


def estimate(arch: Arch, scenario: str, precision: str, batch: int, shards: int = 1,
             memory: str = "none", prompt_len: int = 0, new_tokens: int = 0,
             params: Optional[int] = None) -> Optional[Estimate]:
    """One device's floor for a run of ``arch`` at per-device ``batch``; ``shards``: the devices
    ``parallel=fsdp`` shards the training state over (1: replicated); ``params``: the count
    where the table has none (a user's model, counted from a shape-only build). None: not
    estimable."""
    n = param_count(arch) if params is None else params
    if n is None:
        return None
    act_bytes = 2 if precision in MIXED else 4
    copy = {"bf16/fp16 weight copy": 2.0 * n} if precision in MIXED else {}
    spec = families.of(arch)
    # beyond the state, what the family's spec counts (a decoder LM's activations, logits and
    # KV cache); {} where it counts none
    beyond = spec.activations or (lambda *args: {})
    notes = [spec.memory_note] if spec.activations else [
        f"the state only: activations not estimated for {arch.family}"]
    if not scenarios.get(scenario).trains:
        # a decoding LM holds a KV cache, not the logits of a batch
        phase = "decode" if scenarios.get(scenario).decodes else "forward"
        parts = {"weights": 4.0 * n, **copy,
                 **beyond(arch, phase, batch, act_bytes, memory, prompt_len, new_tokens)}
        return Estimate(parts, 0.0, tuple(notes))
    opt = spec.optimizer(arch, batch)[0]  # the optimiser every framework builds
    state = {"weights": 4.0 * n, "gradients": 4.0 * n,
             f"{'AdamW moments' if opt == 'adamw' else 'SGD momentum'}": OPTIMISER_BYTES[opt] * n}
    parts = {k: v / shards for k, v in state.items()}
    # fsdp casts and gathers one unit at a time: a floor counts the copy of the shard only
    parts.update({k: v / shards for k, v in copy.items()})
    parts.update(beyond(arch, "train", batch, act_bytes, memory, prompt_len, new_tokens))
    return Estimate(parts, sum(state.values()), tuple(notes))


def host_memory_bytes(root: Path = Path("/")) -> Optional[tuple[float, str]]:
    """(bytes, source) of this machine's memory: MemTotal, or the cgroup's limit where lower."""
    found: list[tuple[float, str]] = []
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                found.append((float(line.split()[1]) * 1024, "MemTotal"))
    except OSError:
        pass
    for path in ("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = (root / path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max" / a huge value: no limit
            found.append((float(text), "cgroup limit"))
    return min(found) if found else None


def gpu_memory_bytes(devices: int) -> Optional[float]:
    """Total memory of the smallest of the first ``devices`` GPUs (NVML); None where NVML or
    the device mapping is unsure (fxtrack.measure.nvml.handles)."""
    try:
        import pynvml  # nvidia-ml-py: a thin ctypes binding, no framework
    except ImportError:
        return None
    from fxtrack.measure import nvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        found = nvml.handles(pynvml, range(devices))
        if not found:
            return None
        return float(min(pynvml.nvmlDeviceGetMemoryInfo(h).total for h in found))
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def available(kind: Optional[str], devices: int) -> Optional[Available]:
    """What the run's devices have; ``kind`` None: hardware=auto with a GPU visible (its GPUs).
    None: not known (no NVML), and the check is skipped."""
    override = os.environ.get(MEMORY_ENV)
    shared = devices if kind == "cpu" else 1
    if override:
        if override.lower() == "off":
            return None
        return Available(float(override) * GIB, MEMORY_ENV, shared)
    if kind == "cpu":
        host = host_memory_bytes()
        return None if host is None else Available(host[0], f"this machine's {host[1]}", shared)
    gpu = gpu_memory_bytes(devices)
    return None if gpu is None else Available(gpu, "the GPU's total memory (NVML)")


def _gib(value: float) -> str:
    return f"{value / GIB:.1f}" if value >= GIB / 10 else f"{value / GIB:.2f}"


def refusal(arch: Arch, scenario: str, precision: str, batch: Optional[int], kind: Optional[str],
            devices: int = 1, nodes: int = 1, parallel: str = "ddp", memory: str = "none",
            size: str = "full", prompt_len: int = 0, new_tokens: int = 0,
            source: Callable[[Optional[str], int], Optional[Available]] = available,
            count: Optional[Callable[[], tuple[Optional[int], str]]] = None
            ) -> Optional[str]:
    """Why this run cannot fit (one line: the estimate and its parts, what is available, what
    to change), or None when it may. ``source``: where the available memory is read (tests
    pass a fake device). ``count``: model=custom's (parameters, why not) from a shape-only
    build, asked only once the available memory is known (it starts a short worker)."""
    have = source(kind, devices)
    if have is None:
        return None
    params = None
    if families.of(arch).user is not None:  # no table: a shape-only build counts
        params = count()[0] if count is not None else None
        if params is None:  # not counted: the run's worker reports a broken builder
            return None
    per_device = batch or architectures.run_defaults(arch.name, kind or "gpu", None, None, None)[0]
    # a device sweep (scenario=scaling) runs its x1 baseline on one device, then the full count
    counts = [1, devices] if scenarios.get(scenario).sweeps_devices else [devices]
    worst: Optional[tuple[float, Estimate, int]] = None
    for count in counts:
        shards = count * nodes if parallel == "fsdp" else 1
        est = estimate(arch, scenario, precision, per_device, shards, memory, prompt_len,
                       new_tokens, params)
        if est is None:
            return None
        on_host = count if have.shared_by > 1 else 1
        need = est.total * on_host
        if worst is None or need > worst[0]:
            worst = (need, est, on_host)
    assert worst is not None
    need, est, on_host = worst
    if need <= have.bytes:
        return None
    parts = " + ".join(f"{name} {_gib(v)}" for name, v in est.parts.items())
    what = "training" if scenarios.get(scenario).trains else scenario
    needs = (f"~{_gib(est.total)} GiB per device x {on_host} devices on one host = "
             f"{_gib(need)} GiB" if on_host > 1 else f"~{_gib(need)} GiB")
    floor = "; ".join(("a floor: the framework's own footprint not counted", *est.notes))
    model = (f"model=custom ({params:,} parameters, counted from a shape-only build)"
             if params is not None else f"model={arch.name}")
    return (f"{model} {what} at batch_size={per_device} needs {needs} ({parts}; "
            f"{floor}), more than the {_gib(have.bytes)} GiB of {have.source}; to fit: "
            + ", ".join(fixes(arch, scenario, precision, per_device, kind, parallel, memory, size,
                              est)))


def fixes(arch: Arch, scenario: str, precision: str, batch: int, kind: Optional[str],
          parallel: str, memory: str, size: str, est: Estimate) -> list[str]:
    """The changes that shrink this estimate, the largest levers first."""
    training = scenarios.get(scenario).trains
    state = f"shards the {_gib(est.sharded_state)} GiB of weights, gradients and optimiser state"
    if kind == "cpu":  # one host's device processes share its RAM: only more hosts help
        fsdp = (f"parallel=fsdp over hardware.nodes=N hosts ({state}; the devices of one CPU "
                "host share its memory)")
    else:
        fsdp = f"parallel=fsdp devices=N ({state} N ways)"
    if families.of(arch).user is not None:  # a built model: fxtrack cannot resize it
        out = ["a smaller model (its builder's model.kwargs)"]
        if training and arch.dims.get("optimizer") == "adamw":
            out.append("model.optimizer=sgd (one moment a parameter, not AdamW's two)")
        if training:  # sharded by the generic policy (docs/your-own-model.md)
            out += [f"{fsdp} with framework=torch or jax", "scenario=inference (weights only)"]
        return out
    out = [] if size == "tiny" else ["size=tiny"]
    if getattr(arch, "layers", 1) > 1:
        out.append(f"fewer model.layers ({arch.layers} now)")
    if training:
        out.append(fsdp)
    if precision not in MIXED and any(k in est.parts for k in ("activations", "KV cache")):
        out.append("precision=bf16 (halves the activations; the weights stay fp32)")
    if training and memory != "checkpoint" and "activations" in est.parts:
        out.append("memory=checkpoint (keeps each block's input only)")
    counted = families.of(arch).activations is not None  # the others' activations are not
    if batch > 1 and counted:
        out.append(f"a smaller batch_size ({batch} now)")
    if counted:
        out.append("a shorter " + ("scenario.prompt_len / scenario.new_tokens" if
                                   scenarios.get(scenario).decodes else f"model.seq_len ({arch.seq_len} now)"))
    return out
