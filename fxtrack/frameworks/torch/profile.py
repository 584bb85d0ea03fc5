"""The profile capability for PyTorch: a few training steps under ``torch.profiler.profile``,
read from its own event list (fxtrack.frameworks.profiling.torch_trace), each op named by
``profiling.aten_category`` from its name and its ancestors' (torch.optim's ``Optimizer.step#``
annotation: optimizer; scaled_dot_product_attention: attention; mm/addmm/bmm/linear/conv and
their backward nodes: matmul). Only dispatcher ops count as covered time (``torch_op``), so the
Python and dispatch between ops is overhead. A CUDA kernel counts on its device's timeline, in
its launching op's category. Limit: under torch.compile Inductor's fused CPU kernels are not
recorded (their time reads as overhead), only its extern calls (``aten::mm``) are.
"""

from __future__ import annotations

import torch

from fxtrack.frameworks import profiling
from fxtrack.frameworks.torch.backend import TorchBackend


def split_steps(backend: TorchBackend, steps: int) -> profiling.Split:
    trace = profiling.torch_trace(backend.train_step, steps,
                                          gpu=backend.device_kind() == "gpu")
    ops = [profiling.Op(e.start, e.end, e.thread, profiling.aten_category(e.stats["names"]))
           for e in trace.events if profiling.torch_op(e)]
    return profiling.split(ops, trace, f"torch.profiler {torch.__version__} (prof.events())")
