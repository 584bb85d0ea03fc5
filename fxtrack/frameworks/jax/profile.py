"""The profile capability for JAX: a few training steps under ``jax.profiler.trace``, each in
a ``jax.profiler.StepTraceAnnotation``, the XSpace read back with JAX's own
``jax.profiler.ProfileData``. The trace names each XLA:CPU/GPU instruction it ran (``hlo_op``);
what an instruction is comes from the jitted step's optimised HLO (``JaxBackend.step_hlo``):
the ops inside a fusion and their op_name scopes (the model names ``attention``, the step
``optimizer``: jax.named_scope, names only). The rule: fxtrack.frameworks.profiling.hlo_rule."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import jax

from fxtrack.frameworks import profiling
from fxtrack.frameworks.jax.backend import JaxBackend

STEP = "fxtrack_step"  # the step annotation's name
ATTENTION = re.compile(r"\battention\b")
OPTIMIZER = re.compile(r"\boptimizer\b")


def split_steps(backend: JaxBackend, steps: int) -> profiling.Split:
    from jax.profiler import ProfileData

    rule = profiling.hlo_rule(profiling.hlo_ops(backend.step_hlo()), ATTENTION, OPTIMIZER)
    backend.train_step()  # the step's re-lowering above is off the trace
    with tempfile.TemporaryDirectory() as directory:
        with jax.profiler.trace(directory):
            for i in range(steps):
                with jax.profiler.StepTraceAnnotation(STEP, step_num=i):
                    backend.train_step()
        data = ProfileData.from_file(str(profiling.xplane_file(Path(directory))))
    spans, ops = [], []
    for plane in data.planes:
        for line in plane.lines:
            for e in line.events:
                stats = dict(e.stats)
                start, end = e.start_ns, e.start_ns + e.duration_ns
                if e.name == STEP and "step_num" in stats:
                    spans.append((start, end))
                elif "hlo_op" in stats:  # an executed instruction; its events' names repeat it
                    ops.append(profiling.Op(start, end, f"{plane.name}/{line.name}",
                                            rule(str(stats["hlo_op"]))))
    return profiling.split(ops, sorted(spans),
                           f"jax.profiler {jax.__version__} (ProfileData; ops by the step's HLO)")
