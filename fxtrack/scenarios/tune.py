"""``framework.compile=tune``: time each compile mode the framework declares on this run's own
model and keep the fastest (a user's model gets its best mode without a table row for it).

Each candidate is built as ``framework.compile=true|false`` would build it (same seed), warmed up
(its first step compiles), then a few training steps are timed with the one step timer; the
medians decide (``Framework.resolve_compile(..., "tune", timings)``). The training step is timed
whatever the scenario: it is the step every built model has, and timing a scenario's own step
(a generation, a fed pipeline step) would feed that scenario's own series."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from fxtrack.frameworks.base import Backend
from fxtrack.frameworks.declaration import declaration
from fxtrack.measure.timer import eprint, percentile, time_steps
from fxtrack.worker import protocol

STEPS = 5  # timed steps per candidate (fewer if the run itself asks for fewer)


def fastest(backend: Backend, kind: str, batch: int, steps: int, warmup: int
            ) -> tuple[bool, str, str]:
    """(compile?, the compile_rule tag, the compile_tuned tag) for ``backend``'s spec, timed on
    ``batch``; ``steps`` / ``warmup`` are the run's, capped at STEPS / raised to one warm-up."""
    spec = backend.spec
    framework = declaration(spec.package)
    timings: dict[bool, float] = {}
    if len(framework.tune_modes) > 1:
        for compiled in framework.tune_modes:
            mode = framework.compile_mode_tag(compiled, spec.framework_settings)
            eprint(f"[fxtrack] framework.compile=tune: timing {mode}")
            with requested(spec, compiled):
                backend.build(batch)
                protocol.pass_gate()  # the first build waits there, before anything is timed
                times = time_steps(backend.train_step, max(1, warmup), min(steps, STEPS),
                                   show=False)
            # every process of the run takes the slowest one's figure: they all choose alike
            timings[compiled] = backend.reduce_max(percentile(times.step_times_s, 50))
    compiled, why = framework.resolve_compile(kind, spec.arch["family"], "tune", timings,
                                              spec.framework_settings)
    return compiled, why, framework.tuned_figures(timings, spec.framework_settings)


@contextlib.contextmanager
def requested(spec: Any, compiled: bool) -> Iterator[None]:
    """``spec`` as ``framework.compile=true|false`` writes it while a mode is built (a backend
    that hands the request on, Keras' ``jit_compile``, reads it), ``tune`` again afterwards."""
    asked = spec.compile_request
    spec.compile, spec.compile_request = compiled, "true" if compiled else "false"
    try:
        yield
    finally:
        spec.compile_request = asked
