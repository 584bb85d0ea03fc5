"""Run one job: read the JobSpec, prepare the environment, run the scenario, write the Result."""

from __future__ import annotations

import json
import os
import platform
import sys
import traceback
from pathlib import Path
from typing import Any

from fxtrack import policy
from fxtrack.frameworks.declaration import (
    Framework,
    NotSupported,
    declaration,
    import_path,
)
from fxtrack.worker import protocol
from fxtrack.worker.protocol import JobSpec, Result
from fxtrack.measure.memory import peak_rss_mib
from fxtrack import scenarios
from fxtrack.scenarios import rules


def prepare_environment(spec: JobSpec) -> None:
    """Environment the framework reads when it initialises, so set before it is imported: the
    framework-neutral part here, then the framework's own (its declaration's hook)."""
    env = os.environ
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # NVML and the framework name the same GPU
    if not spec.verbose:
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env.setdefault("GRPC_VERBOSITY", "ERROR")
    if spec.hardware == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    apply_cpu_threads(spec)
    hook = declaration(spec.package).prepare_environment
    if hook is not None:
        hook(spec, env)


def apply_cpu_threads(spec: JobSpec) -> None:
    """``hardware.cpu_threads`` (None: this process's cores) for every framework, before any is
    imported: the OpenMP / MKL / TensorFlow thread variables (fxtrack.policy), and, when fewer
    threads than allowed cores are asked for, the CPU affinity narrowed to the first
    ``cpu_threads`` allowed cores, for every framework alike: XLA:CPU (JAX, and TF's XLA) sizes
    its pools from the affinity and takes no thread-count option (jaxlib 0.10), and the same
    cores for all three keeps the comparison fair. Each backend then sets its framework's own
    knobs and tags what it reads back."""
    threads = policy.cpu_threads(spec.cpu_threads)  # every process of this node together
    os.environ.update(policy.thread_environment(policy.threads_per_process(threads)))
    if hasattr(os, "sched_setaffinity"):
        allowed = policy.allowed_cpus()
        if threads < len(allowed):
            os.sched_setaffinity(0, allowed[:threads])


INTERRUPTED = "interrupted by SIGINT: the worker was stopped"


def _not_installed(framework: Framework, e: ImportError) -> str:
    missing = getattr(e, "name", None) or str(e)
    return (f"{framework.name} is not installed for {sys.executable} ({missing} missing): "
            f"pip install 'fxtrack[{framework.extra}]'")


def run(spec: JobSpec) -> Result:
    protocol.take_gate()  # before anything can start a process that would inherit it
    result = Result(result_id=spec.result_id)
    result.tags["python"] = platform.python_version()
    framework = declaration(spec.package)
    try:
        backend_cls = import_path(framework.backend)
    except ImportError as e:
        result.error = _not_installed(framework, e)
        return result
    try:
        spec.options = scenarios.options_of(spec)  # typed again after the JSON boundary
        backend = backend_cls(spec)
        result.tags["framework_version"] = backend.version()
        # The refusal rules run once: here only where the orchestrator could not run them for
        # this device kind (same rules, same message), before anything is built.
        kind = backend.device_kind()
        why = None if spec.refusals_checked == kind else rules.refusal(
            rules.Combination.of(spec, kind), framework, result.tags["framework_version"])
        if why is not None:
            result.resolved["device_kind"] = kind  # filed with the runs of its hardware
            raise NotSupported(why)
        from fxtrack.measure.peak import native_precision

        # e.g. bf16 on a CPU without AVX-512-BF16 still runs, emulated: the run says so
        native = native_precision(spec.precision, kind)
        if native is not None:
            result.tags["native_precision"] = str(native).lower()
        import_path(spec.runner)(backend, result)  # it passes the gate once it has built
        result.tags.update(backend.device_tags())
        result.status = "FINISHED"
    except protocol.GateClosed as e:  # nothing ran: no traceback, the orchestrator has its own error
        result.error = str(e)
    except KeyboardInterrupt:  # SIGINT sent to the worker itself: a stopped run, not a crash;
        traceback.print_exc()  # the traceback stays in worker.log (the orchestrator's tee)
        result.status, result.error = "KILLED", INTERRUPTED
    except Exception as e:  # the orchestrator turns this into a FAILED run with the traceback
        traceback.print_exc()
        result.error = f"{type(e).__name__}: {e}".splitlines()[0][:500]
        if isinstance(e, NotSupported):  # a combination this framework has no path for:
            result.tags["unsupported"] = "true"  # a "not supported" cell, not a crash
    result.metrics.setdefault("peak_rss_mib", peak_rss_mib())
    return result


def answer_probe(what: str, framework_name: str, package: str, precision: str,
                 hardware: str) -> int:
    """Answer ``--describe`` or ``--matmul`` with one JSON line about this framework, without a
    model: version and visible devices (for ``fxtrack doctor``), or a large matmul's TFLOP/s
    (its ``calibration`` capability, for the peak FLOP/s calibration, with
    ``native_precision`` where it is known). Not installed: ``{"installed": false}``; no
    calibration: ``"supported": false`` and the declared reason; the probe's deadline
    (``matmul_probe.DEADLINE_ENV``) passed before it could time anything: ``"stopped": true``."""
    from fxtrack.measure import matmul_probe, peak

    framework = declaration(package)
    # The command line has no room for framework.<key>: the declared defaults.
    settings = {key: setting.default for key, setting in framework.settings.items()}
    spec = JobSpec(result_id=what, framework=framework_name, package=package, scenario=what,
                   runner="", arch={"name": "", "family": "", "dims": {}}, precision=precision,
                   hardware=hardware, devices=1, compile=True, seed=0, batch_size=None,
                   steps=None, warmup_steps=None, result_path="", framework_settings=settings)
    prepare_environment(spec)
    try:
        backend_cls = import_path(framework.backend)
    except ImportError as e:
        print(json.dumps({"installed": False, "missing": getattr(e, "name", None) or str(e)}))
        return 0
    b = backend_cls(spec)
    kind = b.device_kind()
    answer = {"installed": True, "version": b.version(), "device": b.device_tags().get("device", kind)}
    if what == "--describe":
        answer["devices"] = b.visible_devices()
    elif framework.has("calibration"):
        try:
            answer["tflops"] = b.capability("calibration").matmul_tflops(b)
        except matmul_probe.OutOfTime:
            answer["stopped"] = True
        answer["native_precision"] = peak.native_precision(precision, kind)
    else:
        answer.update(supported=False, reason=str(framework.unsupported("calibration")))
    print(json.dumps(answer))
    return 0


def count_params(spec_path: Path) -> int:
    """Answer ``--params SPEC.json`` with one JSON line: model=custom's trainable parameters
    from an abstract build (the ``user_model`` capability's ``abstract_param_count``: shapes,
    no weights), for the memory pre-check before any timed worker; ``{"error": ...}`` where the
    builder cannot be built so (the run's own worker then reports it)."""
    spec = JobSpec.read(spec_path)
    prepare_environment(spec)
    framework = declaration(spec.package)
    try:
        backend = import_path(framework.backend)(spec)
        count = backend.capability("user_model").abstract_param_count(backend)
        answer: dict[str, Any] = {"param_count": int(count)}
    except Exception as e:  # noqa: BLE001  (any builder error: the pre-check is then skipped)
        answer = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:500]}
    print(json.dumps(answer))
    return 0


def die_with_parent(poll_s: float = 0.5) -> None:
    """End this worker's process group when its parent (the orchestrator, or torchrun for a
    rank) is gone: an orchestrator killed outright (SIGKILL, the OOM killer) cannot stop the
    worker, which in a session of its own ran on to the end unwatched (issue 43)."""
    import signal
    import threading
    import time

    parent = os.getppid()
    expected = os.environ.get(protocol.PARENT_ENV)
    if "RANK" not in os.environ and expected and int(expected) != parent:
        parent = -1  # the orchestrator was gone before this line: the check below fires at once

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        # no last word: stdout is a pipe to the dead orchestrator (a print raises EPIPE)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="fxtrack-parent-watch", daemon=True).start()


def start(argv: list[str]) -> JobSpec | int:
    """The job's spec, this worker set up to run it (the load sampler, the watch on its parent,
    the framework's environment); for a probe or a bad command line, the exit status instead."""
    if len(argv) == 5 and argv[0] in ("--matmul", "--describe"):
        return answer_probe(argv[0], *argv[1:])
    if len(argv) == 2 and argv[0] == "--params":
        return count_params(Path(argv[1]))
    if len(argv) != 1:
        print("usage: python -m fxtrack.worker SPEC.json\n"
              "       python -m fxtrack.worker --matmul|--describe FRAMEWORK PACKAGE PRECISION HARDWARE\n"
              "       python -m fxtrack.worker --params SPEC.json",
              file=sys.stderr)
        return 2
    spec = JobSpec.read(Path(argv[0]))
    from fxtrack.measure import host_load

    orchestrator = os.environ.get(protocol.PARENT_ENV)
    host_load.start_sampling(spec.cpu_threads, int(orchestrator) if orchestrator else None)
    die_with_parent()
    prepare_environment(spec)
    return spec


def finish(spec: JobSpec, result: Result) -> int:
    """Write the job's Result (rank 0 speaks for every rank); the worker's exit status."""
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for every rank
        result.dump(Path(spec.result_path))
    if result.error:
        verb = "stopped" if result.status == "KILLED" else "failed"
        print(f"[fxtrack] job {verb}: {result.error}", file=sys.stderr)
    if result.status == "KILLED":
        return 130  # the shell's status for SIGINT
    return 0 if result.status == "FINISHED" else 1


def leave(code: int) -> None:
    """Exit once the Result is written, without the interpreter's teardown: freeing a
    framework's modules and pools took a tiny job's worker 0.36 s that the orchestrator waited
    on for nothing (issue 61). What it leaves running (a compiler's worker pool) is in this
    worker's process group, which the orchestrator stops once the worker is gone. A torchrun
    rank exits as usual: its peers may still wait on its collective teardown."""
    sys.stdout.flush()
    sys.stderr.flush()
    if "RANK" in os.environ:
        sys.exit(code)
    os._exit(code)


if __name__ == "__main__":  # start, run, finish: run is one frame below this line
    job = start(sys.argv[1:])
    leave(job if isinstance(job, int) else finish(job, run(job)))
