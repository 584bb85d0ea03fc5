"""The profile capability for TensorFlow: a few training steps under
``tf.profiler.experimental.start/stop``, each in a ``tf.profiler.experimental.Trace`` step
annotation, the XSpace (``.xplane.pb``) read with the XSpace protobuf TensorFlow ships
(fxtrack.frameworks.profiling.tf_trace).

Under XLA (the step compiled whole) the trace names each executed instruction (``hlo_op``), read
as the step's optimised HLO has it (``TensorFlowBackend.step_hlo``: the ops inside a fusion,
their TF op names); as a tf.function graph it names each TF op (``scope/name:Type``). The rule
on TF op names: optimizer under the Keras optimiser's scope (``adam_w/``, ``coupled_sgd/``); attention
for the einsums and softmax of Keras' ``ops.dot_product_attention``, which on TensorFlow runs
``tf.einsum`` and ``tf.nn.softmax`` (named ``einsum*/`` and ``Softmax``; no other op of
fxtrack's TF models is); matmul for MatMul, BatchMatMul, Conv and Einsum op types (XLA: dots
and convolutions); the rest norm_elementwise. Limit: a user's model with its own einsums or
softmax would read them as attention.
"""

from __future__ import annotations

import re

import tensorflow as tf

from fxtrack.frameworks import profiling
from fxtrack.frameworks.tensorflow.backend import TensorFlowBackend

# the scopes Keras' optimisers run under: AdamW's adam_w, fxtrack's CoupledSGD's coupled_sgd
OPTIMIZERS = ("adam_?w", "adam", "sgd", "coupled_sgd")
ATTENTION = re.compile(r"(^|/)einsum(_\d+)?/|(^|/)Softmax(/|$)")
MATMUL_TYPES = re.compile(r"MatMul|Conv|Einsum")


def optimizer_scope(backend: TensorFlowBackend) -> re.Pattern:
    """Op names under the optimiser's scope (the backend's, by its name, or a known one)."""
    names = "|".join((re.escape(backend.opt.name), *OPTIMIZERS))
    return re.compile(rf"^(gradient_tape/)?({names})(_\d+)?/", re.I)


def graph_category(name: str, op_type: str, optimizer: re.Pattern) -> str:
    """A tf.function graph op's category from its name (``scope/op``) and type."""
    if optimizer.search(name):
        return "optimizer"
    if ATTENTION.search(name):
        return "attention"
    if MATMUL_TYPES.search(op_type):
        return "matmul"
    return "norm_elementwise"


def split_steps(backend: TensorFlowBackend, steps: int) -> profiling.Split:
    hlo = backend.step_hlo()
    optimizer = optimizer_scope(backend)
    rule = (profiling.hlo_rule(profiling.hlo_ops(hlo), ATTENTION, optimizer)
            if hlo is not None else None)
    backend.train_step()  # the HLO's compilation above is off the trace
    spans, events = profiling.tf_trace(backend.train_step, steps)
    ops = []
    for e in events:
        if rule is not None and "hlo_op" in e.stats:  # an executed XLA instruction
            ops.append(profiling.Op(e.start, e.end, e.thread, rule(e.name)))
        elif rule is None and graph_op(e):
            ops.append(profiling.Op(e.start, e.end, e.thread,
                                    graph_category(e.name.partition(":")[0], e.display,
                                                   optimizer)))
    how = "ops by the step's HLO" if rule is not None else "tf.function graph ops"
    return profiling.split(ops, spans,
                           f"tf.profiler {tf.__version__} (XSpace via xplane_pb2; {how})")


def graph_op(e: profiling.TraceEvent) -> bool:
    """A TF op's event (``scope/name:Type``, its type the display name), not a function call's
    (``__inference_step_N``)."""
    return bool(e.display) and ":" in e.name and not e.display.startswith("__")
