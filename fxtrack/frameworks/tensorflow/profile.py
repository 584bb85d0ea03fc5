"""The profile capability for TensorFlow: a few training steps under
``tf.profiler.experimental.start/stop``, each in a ``tf.profiler.experimental.Trace`` step
annotation, the XSpace (``.xplane.pb``) read with the XSpace protobuf TensorFlow ships
(fxtrack.frameworks.profiling.tf_trace).

Under XLA (the step compiled whole) the trace names each executed instruction (``hlo_op``), read
as the step's optimised HLO has it (``TensorFlowBackend.step_hlo``: the ops inside a fusion,
their TF op names; ``profiling.hlo_rule``); as a tf.function graph it names each TF op
(``scope/name:Type``; ``profiling.tf_graph_category``). Either way on TF op names: optimizer
under the Keras optimiser's scope, attention for the einsums and softmax of Keras'
``ops.dot_product_attention``, matmul for dots, convolutions, MatMul/Conv/Einsum op types.
Limit: a user's model with einsums or a softmax of its own would read them as attention.
"""

from __future__ import annotations

import tensorflow as tf

from fxtrack.frameworks import profiling
from fxtrack.frameworks.tensorflow.backend import TensorFlowBackend


def split_steps(backend: TensorFlowBackend, steps: int) -> profiling.Split:
    hlo = backend.step_hlo()
    optimizer = profiling.tf_optimizer_scope(backend.opt.name)
    rule = (profiling.hlo_rule(profiling.hlo_ops(hlo), profiling.TF_ATTENTION, optimizer)
            if hlo is not None else None)
    backend.train_step()  # the HLO's compilation above is off the trace
    trace = profiling.tf_trace(backend.train_step, steps)
    if rule is not None:  # the executed XLA instructions
        ops = [profiling.Op(e.start, e.end, e.thread, rule(e.name))
               for e in trace.events if "hlo_op" in e.stats]
    else:
        ops = [profiling.Op(e.start, e.end, e.thread, profiling.tf_graph_category(e, optimizer))
               for e in trace.events if profiling.tf_graph_op(e)]
    how = "ops by the step's HLO" if rule is not None else "tf.function graph ops"
    return profiling.split(ops, trace,
                           f"tf.profiler {tf.__version__} (XSpace via xplane_pb2; {how})")
