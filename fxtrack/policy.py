"""The fairness rules, in one place: which compile mode ``framework.compile=auto`` means for a
framework on a device, how many CPU threads a run uses, and how each framework's precision setting
reads. Imports no framework: the worker calls it before (and after) importing its own.

Every rule here is either a framework's documented best practice or a measured choice; a measured
choice says so, with the figure and the command that gave it.
"""

from __future__ import annotations

import os
from typing import Optional

COMPILE_REQUESTS = ("auto", "true", "false")


def resolve_compile(framework: str, device_kind: str, family: str,
                    request: str = "auto") -> tuple[bool, str]:
    """(compile?, why) for ``framework.compile=request`` on ``device_kind`` (cpu | gpu) and a
    model ``family`` (resnet | vit | bert). ``true`` / ``false`` are obeyed as asked; ``auto`` is
    each framework's best-known mode there:

    - jax: always ``jax.jit`` (op-by-op dispatch is JAX's debugging mode, never its fast path).
    - tensorflow: XLA (``jit_compile=True``) on a GPU; on a CPU a plain ``tf.function`` graph,
      as Keras' own ``jit_compile="auto"`` chooses. Measured on this project (ResNet-50, 64 px,
      batch 4, CPU): 430-1,270 ms/step with XLA vs 163-193 ms as a plain tf.function
      (``python bench/tf_compile.py`` prints the comparison).
    - torch: ``torch.compile`` on a GPU (inductor's Triton kernels, fused loss); on a CPU, eager.
      Measured on a shared 2-core machine (contended; tiny settings, compile time excluded),
      see CPU_TORCH_COMPILE_NOTE below.
    """
    if request not in COMPILE_REQUESTS:
        raise ValueError(f"framework.compile must be one of {', '.join(COMPILE_REQUESTS)}, "
                         f"got {request!r}")
    if request != "auto":
        return request == "true", f"framework.compile={request}"
    if framework == "jax":
        return True, "auto: jax always jits"
    if framework == "tensorflow":
        if device_kind == "gpu":
            return True, "auto: XLA on GPU"
        return False, "auto: tf.function without XLA on CPU (measured: XLA 2-7x slower, ResNet-50)"
    if framework == "torch":
        if device_kind == "gpu":
            return True, "auto: torch.compile on GPU"
        return False, f"auto: eager on CPU ({CPU_TORCH_COMPILE_NOTE})"
    return True, "auto: unknown framework, compiled"


# The measurement behind torch's CPU rule, on this project's shared 2-core machine while other
# test suites ran (contended: the figures moved 2-6x between rounds). Worker runs in-process,
# torch 2.13 CPU, batch 4, 10 timed steps after 2 warm-up, fp32, two rounds each, p50 ms/step:
#   tiny ViT:        eager 273 / 137,   torch.compile 170 / 858,   first compile 33 s
#   ResNet-50 32 px: eager 1542 / 1607, torch.compile 2287 / 1155, first compile 244 s
# No consistent step-time gain, and a compile that costs 0.5-4 minutes per run: eager on CPU.
# Re-measured on the quiet machine (host_other_cpu_frac 0 in every window), 3 round-robin repeats,
# `python -m fxtrack -m framework=torch framework.compile=true,false hardware=cpu model=vit
# size=tiny batch_size=4 steps=10 warmup_steps=2 repeats=3`: eager 72.9 samples/s [67.6, 78.7],
# torch.compile 65.0 [59.9, 68.7] (median, 95% interval): eager is the faster mode here too.
# (A loop over fxtrack.worker.run with compile=True/False, tests/conftest.job_spec; re-measure on a
# quiet machine with `python -m fxtrack -m framework=torch framework.compile=true,false
# hardware=cpu model=vit,resnet50 size=tiny repeats=3`.)
CPU_TORCH_COMPILE_NOTE = "no consistent CPU step-time gain measured, 0.5-4 min compile"


def jax_donates(device_kind: str) -> tuple[bool, str]:
    """Whether JAX's jitted training step donates its state (``donate_argnums``: the new
    parameters and optimiser state are written into the old buffers), and why.

    On GPU / TPU it does: the state is not held twice, XLA's documented fast path. On CPU it
    does not: donation made the whole step slower there, measured by the side-by-side steps of
    JAX_CPU_DONATION_NOTE. The run is tagged ``fxtrack.jax_donation`` with this reason."""
    if device_kind == "cpu":
        return False, f"off on CPU ({JAX_CPU_DONATION_NOTE})"
    return True, f"state donated on {device_kind}"


# ViT-B widths, 4 layers, 64 px, batch 8, fp32, jax 0.10.2 on a quiet 2-core Xeon: the same jitted
# step with and without donate_argnums, alternated step by step in one process (80 rounds): the
# donated step took 1.02-1.05x the time of the undonated one in three runs, and fxtrack's step with
# donation was 0.915x [0.908, 0.928] of a bare loop's throughput (python bench/overhead.py
# --frameworks jax) and 0.99-1.00x without it. Why is not established: a likely cause is the copies
# XLA:CPU inserts to keep each output aliased to its input buffer.
JAX_CPU_DONATION_NOTE = "measured 2-5% slower steps with donation on XLA:CPU"


def compile_mode_tag(framework: str, compiled: bool, torch_mode: str = "default") -> str:
    """The ``fxtrack.compile_mode`` tag: what actually ran."""
    if framework == "torch":
        return f"inductor:{torch_mode}" if compiled else "eager"
    if framework == "tensorflow":
        return "xla" if compiled else "tf.function"
    if framework == "jax":
        return "jit" if compiled else "op-by-op"
    return "compiled" if compiled else "eager"


def allowed_cpus() -> list[int]:
    """The CPU ids this process may run on: its affinity mask, not the machine's core count (a
    container or ``taskset`` gives fewer); every CPU where there are no masks (macOS)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpu_threads(requested: Optional[int]) -> int:
    """``hardware.cpu_threads``, or (None) the cores this process may run on."""
    return int(requested) if requested else len(allowed_cpus())


def threads_per_process(threads: int) -> int:
    """A process's share of ``threads``: torchrun starts one process per device
    (LOCAL_WORLD_SIZE of them on this node), which together use the cores one JAX or TF process
    uses for all its devices; torchrun's own default (OMP_NUM_THREADS=1) would leave cores idle."""
    return max(1, threads // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def thread_environment(threads: int, framework: str) -> dict[str, str]:
    """Environment variables that size every framework's CPU thread pools to ``threads``; set
    before the framework is imported (its pools are created at import / first use).

    OpenMP (torch's intra-op pool, oneDNN) and MKL read OMP/MKL_NUM_THREADS; TensorFlow reads
    TF_NUM_INTRAOP/INTEROP_THREADS; XLA:CPU (JAX, and TF's XLA) sizes its Eigen pool from the
    process's affinity and takes ``--xla_cpu_multi_thread_eigen``; JAX's intra-op pool size is
    set with ``--xla_force_host_platform_device_count`` per device elsewhere, not here."""
    n = str(threads)
    env = {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n,
           "TF_NUM_INTRAOP_THREADS": n, "TF_NUM_INTEROP_THREADS": n}
    if threads == 1 and framework == "jax":
        env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false"
    return env
