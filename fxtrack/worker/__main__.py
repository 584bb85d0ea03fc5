"""Run one job: read the JobSpec, prepare the environment, run the scenario, write the Result."""

from __future__ import annotations

import importlib
import json
import os
import platform
import sys
import traceback
from pathlib import Path

from fxtrack import policy
from fxtrack.job import JobSpec, Result
from fxtrack.measure.memory import peak_rss_mib


def load(path: str):
    """Import ``"package.module.Name"`` and return ``Name``."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def prepare_environment(spec: JobSpec) -> None:
    """Environment every framework reads when it initialises, so set before any import."""
    env = os.environ
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # NVML and the framework name the same GPU
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX: peak memory, not the pool
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")  # TF: likewise
    if not spec.verbose:
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env.setdefault("GRPC_VERBOSITY", "ERROR")
    if spec.hardware == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["JAX_PLATFORMS"] = "cpu"
        if spec.devices > 1:  # JAX: N host devices stand in for N accelerators
            _xla_flag(f"--xla_force_host_platform_device_count={spec.devices}")
    elif spec.framework == "jax" and spec.devices * spec.nodes > 1:
        # Overlap the gradient all-reduce with the backward pass (XLA:GPU's latency-hiding
        # scheduler; TF's and torch's DDP overlap theirs by default). Read only by XLA:GPU.
        _xla_flag("--xla_gpu_enable_latency_hiding_scheduler=true")
    apply_cpu_threads(spec)


def _xla_flag(flag: str) -> None:
    """Append one flag to XLA_FLAGS (read by XLA when JAX or TF starts its backend)."""
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()


def apply_cpu_threads(spec: JobSpec) -> None:
    """``hardware.cpu_threads`` (None: this process's cores) for every framework, before any is
    imported: the OpenMP / MKL / TensorFlow thread variables (fxtrack.policy), and, when fewer
    threads than allowed cores are asked for, the CPU affinity narrowed to the first
    ``cpu_threads`` allowed cores, for every framework alike: XLA:CPU (JAX, and TF's XLA) sizes
    its pools from the affinity and takes no thread-count option (jaxlib 0.10), and the same
    cores for all three keeps the comparison fair. Each backend then sets its framework's own
    knobs and tags what it reads back."""
    threads = policy.cpu_threads(spec.cpu_threads)  # every process of this node together
    mine = policy.threads_per_process(threads)
    for key, value in policy.thread_environment(mine, spec.framework).items():
        if key == "XLA_FLAGS":
            _xla_flag(value)
        else:
            os.environ[key] = value
    if hasattr(os, "sched_setaffinity"):
        allowed = policy.allowed_cpus()
        if threads < len(allowed):
            os.sched_setaffinity(0, allowed[:threads])


def run(spec: JobSpec) -> Result:
    result = Result(result_id=spec.result_id)
    result.tags["python"] = platform.python_version()
    try:
        backend_cls = load(spec.backend)
    except ImportError as e:
        missing = getattr(e, "name", None) or str(e)
        result.error = (f"{spec.framework} is not installed for {sys.executable} ({missing} missing): "
                        f"pip install 'fxtrack[{spec.extra}]'")
        return result
    try:
        backend = backend_cls(spec)
        result.tags["framework_version"] = backend.version()
        load(spec.runner)(backend, result)
        result.tags.update(backend.device_tags())
        result.status = "FINISHED"
    except Exception as e:  # the orchestrator turns this into a FAILED run with the traceback
        traceback.print_exc()
        result.error = f"{type(e).__name__}: {e}".splitlines()[0][:500]
        if isinstance(e, NotImplementedError):  # a combination this framework has no path for:
            result.tags["unsupported"] = "true"  # a "not supported" cell, not a crash
    result.metrics.setdefault("peak_rss_mib", peak_rss_mib())
    return result


def probe(what: str, framework: str, backend: str, precision: str, hardware: str) -> int:
    """Print one JSON line about this framework, without a model: ``--describe`` (version and
    visible devices, for ``fxtrack doctor``) or ``--matmul`` (large-matmul TFLOP/s, for the peak
    FLOP/s calibration). A framework that is not installed answers ``{"installed": false}``."""
    spec = JobSpec(result_id=what, framework=framework, backend=backend, extra=framework,
                   scenario=what, runner="", arch={"name": "", "family": "", "dims": {}},
                   precision=precision, hardware=hardware, devices=1, compile=True, seed=0,
                   batch_size=None, steps=None, warmup_steps=None, result_path="")
    prepare_environment(spec)
    try:
        backend_cls = load(backend)
    except ImportError as e:
        print(json.dumps({"installed": False, "missing": getattr(e, "name", None) or str(e)}))
        return 0
    b = backend_cls(spec)
    kind = b.device_kind()
    answer = {"installed": True, "version": b.version(), "device": b.device_tags().get("device", kind)}
    if what == "--describe":
        answer["devices"] = b.visible_devices()
    else:
        answer["tflops"] = b.matmul_tflops()
    print(json.dumps(answer))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] in ("--matmul", "--describe"):
        return probe(argv[0], *argv[1:])
    if len(argv) != 1:
        print("usage: python -m fxtrack.worker SPEC.json\n"
              "       python -m fxtrack.worker --matmul|--describe FRAMEWORK BACKEND PRECISION HARDWARE",
              file=sys.stderr)
        return 2
    spec = JobSpec.load(Path(argv[0]))
    prepare_environment(spec)
    result = run(spec)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for every rank
        result.dump(Path(spec.result_path))
    if result.error:
        print(f"[fxtrack] job failed: {result.error}", file=sys.stderr)
    return 0 if result.status == "FINISHED" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
