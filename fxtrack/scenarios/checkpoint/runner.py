"""The checkpoint scenario: save and restore the full training state, prove the restored state
reproduces the next step's loss exactly, then export for serving and compare the exported
model's latency with the live model's."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from fxtrack import families
from fxtrack.frameworks.base import Backend
from fxtrack.worker.protocol import Result
from fxtrack.measure.memory import peak_rss_mib
from fxtrack.measure.timer import eprint, percentile, time_steps
from fxtrack.scenarios.timed import build


EXPORT_TOLERANCE = 1e-4  # fp32 relative error of a user's exported model against the live one


def _mib(directory: Path) -> float:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()) / 2**20


def run(backend: Backend, result: Result) -> None:
    spec = backend.spec
    # Asked for before the build, so that a framework without one costs nothing.
    own = families.of(backend.arch).user
    builder = None if own is None else own.builder_capability
    user_model = builder is not None  # e.g. a user's model: its own forward and export
    state, inference, serving = (backend.capability(name) for name in (
        "checkpoint", builder or "inference",
        "user_serving_export" if user_model else "serving_export"))
    _, _, steps, warmup = build(backend, result)
    for _ in range(warmup):  # optimiser moments exist: the state is a real training state
        backend.train_step()
    m = result.metrics
    work = Path(tempfile.mkdtemp(prefix="fxtrack-ckpt-", dir=Path(spec.result_path).parent))
    try:
        ckpt, exported = work / "checkpoint", work / "export"
        ckpt.mkdir()
        exported.mkdir()
        t0 = time.perf_counter()
        state.save(backend, ckpt)
        m["checkpoint_save_s"] = time.perf_counter() - t0
        m["checkpoint_mib"] = _mib(ckpt)
        expected = backend.loss_value(backend.train_step())  # moves the state on one step
        t0 = time.perf_counter()
        state.restore(backend, ckpt)
        m["checkpoint_restore_s"] = time.perf_counter() - t0
        replayed = backend.loss_value(backend.train_step())  # the same step, from the restore
        m.update(loss_next_step=expected, loss_after_restore=replayed,
                 checkpoint_restore_exact=float(replayed == expected))

        live = inference.prepare_inference(backend) if user_model else inference.prepare(backend)
        t0 = time.perf_counter()
        try:
            served = serving.export(backend, exported)
        except Exception as e:  # noqa: BLE001 - one part costs only itself (issue 43)
            if not user_model:  # fxtrack's own models export: a failure here is a bug
                raise
            # a user's model the exporter cannot take (a cache object in its outputs): the
            # save and restore stand; the export is refused with the exporter's reason
            why = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            result.tags["export_not_supported"] = why
            eprint(f"[fxtrack] the serving export is not supported for this model ({why}); "
                   "the checkpoint's figures stand")
            served = None
        if served is not None:
            if user_model:  # the loaded export's outputs against the live model's, same inputs
                m["export_max_rel_err"] = serving.export_error(backend)
            m["export_s"] = time.perf_counter() - t0
            m["export_mib"] = _mib(exported)
            for label, step in (("live", live), ("export", served)):
                times = time_steps(step, warmup, steps, show=spec.progress,
                                   label=f"{label} model")
                m[f"{label}_latency_ms_p50"] = percentile([t * 1e3 for t in times.step_times_s],
                                                          50)
            m["export_latency_ratio"] = m["export_latency_ms_p50"] / m["live_latency_ms_p50"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    m.update(param_count=float(backend.param_count()), peak_rss_mib=peak_rss_mib())
    if user_model and m.get("export_max_rel_err", 0.0) > EXPORT_TOLERANCE:
        result.guard = (f"the exported model's outputs differ from the live model's "
                        f"(relative error {m['export_max_rel_err']:.3g} > {EXPORT_TOLERANCE})")
    if replayed != expected:
        result.guard = (f"the restored state did not reproduce the next step's loss "
                        f"({expected!r} vs {replayed!r})")
