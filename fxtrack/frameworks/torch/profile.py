"""The profile capability for PyTorch: a few training steps under ``torch.profiler.profile``,
read from its own event list (fxtrack.frameworks.profiling.torch_trace).

The rule, by an op's name and its ancestors' (``cpu_parent``): optimizer inside torch.optim's
``Optimizer.step#...`` annotation; attention inside ``scaled_dot_product_attention`` (forward,
its backward node, the flash kernels); matmul for ``mm``/``addmm``/``bmm``/``baddbmm``/
``matmul``/``linear``/``einsum``/``conv*`` and their backward nodes; the rest norm_elementwise.
Only dispatcher ops (``aten::``, ``mkldnn::``...) count as covered time; the autograd engine's
and torch.optim's annotations are read for ancestry only, so the Python and dispatch between
ops is overhead. A CUDA kernel counts on its device's timeline, in its launching op's
category. Limit: under torch.compile Inductor's fused CPU kernels are not recorded (their time
reads as overhead), only its extern calls (``aten::mm``) are.
"""

from __future__ import annotations

import re

import torch

from fxtrack.frameworks import profiling
from fxtrack.frameworks.torch.backend import TorchBackend

MATMUL = re.compile(r"aten::(mm|addmm|bmm|baddbmm|matmul|linear|einsum|conv\w*|_convolution\w*|"
                    r"mkldnn_\w*conv\w*)$|(Mm|Addmm|Bmm|Baddbmm|Convolution\w*)Backward\d*$")
ATTENTION = re.compile(r"scaled_dot_product|ScaledDotProduct|flash_attention|efficient_attention")
OPTIMIZER = re.compile(r"^Optimizer\.step#")
NOT_AN_OP = re.compile(r"^autograd::engine::|^Optimizer\.")


def category(names: list[str]) -> str:
    """An op's category from its name and its ancestors' (``names``: the op first)."""
    if any(OPTIMIZER.search(n) for n in names):
        return "optimizer"
    if any(ATTENTION.search(n) for n in names):
        return "attention"
    if any(MATMUL.search(n.split(": ")[-1]) for n in names):  # evaluate_function: XBackward0
        return "matmul"
    return "norm_elementwise"


def is_op(e: profiling.TraceEvent) -> bool:
    """A dispatcher op or a CUDA kernel: what counts as covered time."""
    return e.display == "kernel" or ("::" in e.name and not NOT_AN_OP.search(e.name))


def split_steps(backend: TorchBackend, steps: int) -> profiling.Split:
    spans, events = profiling.torch_trace(backend.train_step, steps,
                                          gpu=backend.device_kind() == "gpu")
    ops = [profiling.Op(e.start, e.end, e.thread, category(e.stats["names"]))
           for e in events if is_op(e)]
    return profiling.split(ops, spans, f"torch.profiler {torch.__version__} (prof.events())")
