"""The profile capability for PyTorch: a few training steps under ``torch.profiler.profile``
(CPU activity; CUDA's too on a GPU), each inside ``record_function`` (the step's span), read
from the profiler's own event list (``prof.events()``: each op's interval, thread, parent).

The rule, by an op's name and its ancestors' (``cpu_parent``): optimizer inside torch.optim's
``Optimizer.step#...`` annotation; attention inside ``scaled_dot_product_attention`` (forward,
its backward node, the flash kernels); matmul for ``mm``/``addmm``/``bmm``/``baddbmm``/
``matmul``/``linear``/``einsum``/``conv*`` and their backward nodes; the rest norm_elementwise.
Only dispatcher ops (``aten::``, ``mkldnn::``...) count as covered time; the autograd engine's
and torch.optim's annotations are read for ancestry only, so the Python and dispatch between
ops is overhead. A CUDA kernel counts on its own stream's timeline, in its launching op's
category. Limits: under torch.compile Inductor's fused CPU kernels are not recorded (their
time reads as overhead), only the extern ``aten::mm`` calls are.
"""

from __future__ import annotations

import re

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from fxtrack.frameworks import profiling
from fxtrack.frameworks.torch.backend import TorchBackend

STEP = "fxtrack_step"
MATMUL = re.compile(r"aten::(mm|addmm|bmm|baddbmm|matmul|linear|einsum|conv\w*|_convolution\w*|"
                    r"mkldnn_\w*conv\w*)$|(Mm|Addmm|Bmm|Baddbmm|Convolution\w*)Backward\d*$")
ATTENTION = re.compile(r"scaled_dot_product|ScaledDotProduct|flash_attention|efficient_attention")
OPTIMIZER = re.compile(r"^Optimizer\.step#")
NOT_AN_OP = re.compile(r"^autograd::engine::|^Optimizer\.|^" + STEP + "$")


def category(names: list[str]) -> str:
    """An op's category from its name and its ancestors' (``names``: the op first)."""
    if any(OPTIMIZER.search(n) for n in names):
        return "optimizer"
    if any(ATTENTION.search(n) for n in names):
        return "attention"
    if any(MATMUL.search(n.split(": ")[-1]) for n in names):  # evaluate_function: XBackward0
        return "matmul"
    return "norm_elementwise"


def split_steps(backend: TorchBackend, steps: int) -> profiling.Split:
    activities = [ProfilerActivity.CPU]
    if backend.device_kind() == "gpu":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            with record_function(STEP):
                backend.train_step()
    spans, ops = [], []
    for e in prof.events():
        start, end = e.time_range.start * 1e3, e.time_range.end * 1e3  # us -> ns
        if e.name == STEP and e.device_type == torch.autograd.DeviceType.CPU:
            spans.append((start, end))
            continue
        if e.device_type != torch.autograd.DeviceType.CPU or NOT_AN_OP.search(e.name) or \
                "::" not in e.name:
            continue
        names, parent = [e.name], e.cpu_parent
        while parent is not None:
            names.append(parent.name)
            parent = parent.cpu_parent
        cat = category(names)
        ops.append(profiling.Op(start, end, f"thread {e.thread}", cat))
        for k in e.kernels:  # CUDA: the kernels it launched, on their stream's timeline
            ops.append(profiling.Op(k.time_range.start * 1e3, k.time_range.end * 1e3,
                                    f"cuda:{k.device} stream", cat))
    return profiling.split(ops, sorted(spans),
                           f"torch.profiler {torch.__version__} (prof.events())")
