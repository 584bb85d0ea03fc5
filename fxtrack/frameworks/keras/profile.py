"""The profile capability for Keras, with the profiler of the backend it runs on
(``framework.keras_backend``), read as fxtrack.frameworks.profiling reads that profiler:

- jax: ``jax.profiler.trace`` (ProfileData). Keras compiles its own train step, whose optimised
  HLO is not reachable through Keras' API, so each XLA instruction is read by its name alone
  (``profiling.instruction_category``): dots and convolutions are matmul, the rest
  norm_elementwise; attention and the optimiser are not told apart (both read 0).
- tensorflow: ``tf.profiler.experimental`` (XSpace via the xplane_pb2 TensorFlow ships); a
  tf.function graph's ops by TF op name and type, as framework=tensorflow reads them
  (``profiling.tf_graph_category``, the optimiser by its scope); under XLA each instruction by
  its name alone, as on jax.
- torch: ``torch.profiler`` (``prof.events()``), aten ops as framework=torch reads them
  (``profiling.aten_category``); Keras' optimiser is not torch.optim, so it has no
  ``Optimizer.step#`` annotation: its ops read norm_elementwise (optimizer 0).
"""

from __future__ import annotations

import keras

from fxtrack.frameworks import profiling
from fxtrack.frameworks.keras.backend import KerasBackend


def split_steps(backend: KerasBackend, steps: int) -> profiling.Split:
    name = keras.backend.backend()
    backend.train_step()  # one step between the timed window and the trace, as the others take
    if name == "jax":
        trace = profiling.jax_trace(backend.train_step, steps)
        ops = [profiling.Op(e.start, e.end, e.thread, profiling.instruction_category(e.name))
               for e in trace.events]
        how = "jax.profiler (ProfileData; instructions by name)"
    elif name == "tensorflow":
        trace = profiling.tf_trace(backend.train_step, steps)
        optimizer = profiling.tf_optimizer_scope(backend.model.optimizer.name)
        ops = [profiling.Op(e.start, e.end, e.thread, profiling.instruction_category(e.name))
               if "hlo_op" in e.stats else
               profiling.Op(e.start, e.end, e.thread, profiling.tf_graph_category(e, optimizer))
               for e in trace.events if "hlo_op" in e.stats or profiling.tf_graph_op(e)]
        how = "tf.profiler (XSpace via xplane_pb2)"
    else:
        trace = profiling.torch_trace(backend.train_step, steps,
                                              gpu=backend.device_kind() == "gpu")
        ops = [profiling.Op(e.start, e.end, e.thread, profiling.aten_category(e.stats["names"]))
               for e in trace.events if profiling.torch_op(e)]
        how = "torch.profiler (prof.events())"
    return profiling.split(ops, trace, f"keras {keras.__version__} on {name}: {how}")
