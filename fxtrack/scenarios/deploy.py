"""Inference through a deployment runtime (``runtime=onnxruntime|tflite|openvino|tensorrt``)
or dynamic int8 quantisation (``quantize=dynamic_int8``), timed like every inference run.

The framework's deployment-export capability (``onnx_export``, ``tflite_export`` or
``native_int8``: its ``deployment.py``, fxtrack.frameworks.declaration, one for fxtrack's own
models and a user's) writes the artefact in the worker; the runtime module
(``fxtrack/runtimes/<runtime>.py``) only consumes the file. Every run first checks the runtime's
outputs against the native model's on the same inputs and fails its correctness guard outside
the bound:

- fp32 runtimes: max |out - ref| / max |ref| <= FP32_REL_ERR (1e-3), for every output;
- dynamic int8: the same figure <= INT8_REL_ERR (0.1: int8 weights and per-batch activation
  scales move a logit by up to a few % of the largest one on these models), and, where the
  family's first output is a score vector (``Family.scores``), the top-1 class (argmax of the
  last axis: per image, per BERT token) agrees on >= INT8_TOP1 of them.

A combination that has no path (e.g. PyTorch to TFLite, TensorFlow's native int8: a capability
the framework declares absent, with its reason; TensorRT on a CPU) is refused before any work by
``fxtrack.scenarios.rules`` (in the orchestrator, and again in the worker before the scenario
starts: ``NotSupported``, tagged ``fxtrack.unsupported=true``). An exporter without a path for
one model still raises ``NotSupported`` here.
"""

from __future__ import annotations

import importlib
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from fxtrack import families, flops
from fxtrack.frameworks.base import Backend
from fxtrack.worker.protocol import Result
from fxtrack.measure.timer import eprint
from fxtrack.scenarios import rules
from fxtrack.scenarios.timed import run_timed
from fxtrack.scenarios.timed import user_flops

FP32_REL_ERR = 1e-3
INT8_REL_ERR = 0.1
INT8_TOP1 = 0.9


def export_artefact(backend: Backend, exporter: Any, work: Path,
                    tags: Optional[dict[str, str]] = None) -> Path:
    """Write what ``spec.runtime`` serves into ``work``; returns its path. ``tags``: the
    exporter's (``onnx_exporter``)."""
    spec = backend.spec
    int8 = spec.quantize == "dynamic_int8"
    if spec.runtime == "tflite":
        return exporter.to_tflite(backend, work / "model.tflite", quantize=int8)
    path = exporter.to_onnx(backend, work / "model.onnx", tags)
    if int8:  # ONNX Runtime's quantiser; OpenVINO then runs the same int8 graph
        from fxtrack.runtimes import onnxruntime as ort_runtime

        path = ort_runtime.quantize_dynamic(path, work / "model.int8.onnx")
    return path


def artefact_bytes(path: Path) -> int:
    """Size of what the runtime loads: the file, plus for ONNX the external data files its
    tensors point to (jax2onnx keeps BERT's weights in model.onnx.data: the .onnx alone is
    under 1 MiB)."""
    from fxtrack.runtimes import onnx_external_files

    extra = onnx_external_files(path) if path.suffix == ".onnx" else []
    return sum(p.stat().st_size for p in [path, *extra])


def compare_outputs(refs: list[np.ndarray], outs: list[np.ndarray], int8: bool, scores: bool
                    ) -> tuple[dict[str, float], str]:
    """Error figures of the runtime's ``outs`` against the native ``refs`` (the model's floating
    outputs, in order) and the guard verdict: the worst relative error of any (each of its own
    scale); top-1 agreement over the last axis of the first output when it is measured there
    (``scores``: the output is a score vector, logits) and the last axis has more than one
    entry, and then required for int8."""
    if len(outs) != len(refs):
        return {}, f"the runtime gave {len(outs)} outputs, the native model {len(refs)}"
    errs = [float(np.max(np.abs(np.asarray(out, np.float32).reshape(ref.shape) - ref)))
            for ref, out in zip(refs, outs)]
    rels = [err / max(float(np.max(np.abs(ref))), 1e-12) for err, ref in zip(errs, refs)]
    abs_err, rel_err = float(np.max(errs)), float(np.max(rels))  # NaN if any is (of its scale)
    metrics = {"output_max_abs_err": abs_err, "output_rel_err": rel_err}
    ref, out = refs[0], np.asarray(outs[0], np.float32).reshape(refs[0].shape)
    scores = scores and ref.ndim > 0 and ref.shape[-1] > 1
    if scores:
        metrics["top1_agreement"] = float(np.mean(np.argmax(out, -1) == np.argmax(ref, -1)))
    bound = INT8_REL_ERR if int8 else FP32_REL_ERR
    if not np.isfinite(abs_err) or rel_err > bound:
        return metrics, f"output differs from native: relative error {rel_err:.3g} > {bound:g}"
    if int8 and scores and metrics["top1_agreement"] < INT8_TOP1:
        top1 = metrics["top1_agreement"]
        return metrics, f"int8 top-1 agrees with native on {top1:.0%} < {INT8_TOP1:.0%}"
    return metrics, "ok"


def run(backend: Backend, result: Result,
        evaluate: Optional[Callable[..., None]] = None, **window: Any) -> None:
    """``evaluate``: model.from_run's scoring (``scenarios.accuracy.evaluate``), given the
    served callable once the timed window is over; the run's weights are loaded before the
    export. ``window``: run_timed's floor on the timed window (min_steps, min_duration_s)."""
    spec = backend.spec
    result.tags.update(runtime=spec.runtime, quantize=spec.quantize)
    result.resolved["device_kind"] = backend.device_kind()
    family = families.of(backend.arch)
    user = family.user is not None  # a model a builder makes: its FLOPs counted
    ex = backend.capability(rules.export_capability(spec))  # the worker checked the rules
    work = Path(tempfile.mkdtemp(prefix="fxtrack-deploy-", dir=Path(spec.result_path).parent))
    checked: dict[str, Any] = {}
    exported: list[Path] = []  # the artefact served, kept for the record (Result.artifacts)

    def prepare() -> Callable[[], None]:
        if evaluate is not None:  # the trained weights, before the reference and the export
            from fxtrack.scenarios import accuracy

            accuracy.load(backend)
        x, ref = ex.reference(backend)  # the native model's answer on the resident batch
        t0 = time.perf_counter()
        if spec.runtime == "native":  # quantize=dynamic_int8 in the framework itself
            served = ex.quantize_native(backend)
        else:
            path = export_artefact(backend, ex, work, result.tags)
            checked["artefact_mib"] = artefact_bytes(path) / 2**20
            exported.append(path)
            runtime = importlib.import_module(f"fxtrack.runtimes.{spec.runtime}")
            served = runtime.load(path, result.resolved["device_kind"], spec.cpu_threads)
            # A runtime module's own version, where it has one (tensorrt runs through onnxruntime)
            version = getattr(runtime, "version", None)
            if version is not None:
                result.tags[f"{spec.runtime}_version"] = version()
        checked["export_time_s"] = time.perf_counter() - t0  # export + quantise + load
        int8 = spec.quantize == "dynamic_int8"
        metrics, checked["guard"] = compare_outputs(ref, served(x), int8,
                                                    scores=family.scores(backend.arch))
        checked.update(metrics)
        top1 = metrics.get("top1_agreement")
        eprint(f"[fxtrack] {spec.runtime}/{spec.quantize}: relative error "
               f"{metrics.get('output_rel_err', float('nan')):.2g}"
               + (f", top-1 agreement {top1:.0%}" if top1 is not None else ""))
        checked["served"], checked["like"] = served, x
        return lambda: served(x)  # each call returns once the runtime has the output on the host

    try:  # an exporter without a path for this model raises NotSupported too
        run_timed(backend, result, prepare, user_flops(backend, result, "forward") if user
                  else flops.forward_flops_per_sample(backend.arch), **window)
        served, like = checked.pop("served"), checked.pop("like")
        if evaluate is not None:
            evaluate(backend, result, served, like)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if exported:
        result.artifacts["model"] = str(_keep(exported[0], work))
    shutil.rmtree(work, ignore_errors=True)
    result.guard = checked.pop("guard")
    result.metrics.update(checked)


def _keep(artefact: Path, work: Path) -> Path:
    """Move the served artefact (and the ONNX external data it names) out of ``work`` into
    ``model/`` beside the result, for the orchestrator to log as an MLflow model; the int8
    quantiser's intermediates stay behind and go with ``work``."""
    from fxtrack.runtimes import onnx_external_files

    keep = work.parent / "model"
    shutil.rmtree(keep, ignore_errors=True)
    keep.mkdir()
    extra = onnx_external_files(artefact) if artefact.suffix == ".onnx" else []
    for path in [artefact, *extra]:
        shutil.move(str(path), keep / path.name)
    return keep / artefact.name


def latency_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """``latency_ms_p50|p90|p99``: an inference step is one batch, so its time is the latency."""
    return {f"latency_ms_p{q}": metrics[f"step_time_ms_p{q}"] for q in (50, 90, 99)
            if f"step_time_ms_p{q}" in metrics}


def is_deploy(spec: Any) -> bool:
    return spec.runtime != "native" or spec.quantize != "none"


