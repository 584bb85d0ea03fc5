"""The profile capability for JAX: a few training steps under ``jax.profiler.trace``, read with
JAX's own ``jax.profiler.ProfileData`` (fxtrack.frameworks.profiling.jax_trace). The trace names
each XLA instruction it ran (``hlo_op``); what an instruction is comes from the jitted step's
optimised HLO (``JaxBackend.step_hlo``): the ops inside a fusion and their op_name scopes (the
model names ``attention``, the step ``optimizer``: jax.named_scope, names only). The rule:
fxtrack.frameworks.profiling.hlo_rule."""

from __future__ import annotations

import re

import jax

from fxtrack.frameworks import profiling
from fxtrack.frameworks.jax.backend import JaxBackend

ATTENTION = re.compile(r"\battention\b")
OPTIMIZER = re.compile(r"\boptimizer\b")


def split_steps(backend: JaxBackend, steps: int) -> profiling.Split:
    rule = profiling.hlo_rule(profiling.hlo_ops(backend.step_hlo()), ATTENTION, OPTIMIZER)
    backend.train_step()  # the step's re-lowering above is off the trace
    trace = profiling.jax_trace(backend.train_step, steps)
    ops = [profiling.Op(e.start, e.end, e.thread, rule(e.name)) for e in trace.events]
    return profiling.split(ops, trace,
                           f"jax.profiler {jax.__version__} (ProfileData; ops by the step's HLO)")
