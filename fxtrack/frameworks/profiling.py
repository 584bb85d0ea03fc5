"""The time split of a profiled training step (the ``profile`` capability), framework-neutral:
the categories, the split of a trace's op intervals into them, and the readers of what the
profilers write (an XSpace ``.xplane.pb``, an optimised HLO module's text). Each framework's
``profile`` module runs its own profiler and names its own category rule; this module imports
no framework at import time (the readers import the one that wrote the file, when called).

The split, the same for every framework: each profiled step's wall span (the framework's own
step annotation) is cut at every op boundary; on each thread the innermost op running in a
piece owns it; a piece with ops on several threads at once is shared equally among those
threads' categories (so overlapping threads never count the same wall time twice: the
categories plus ``overhead`` sum to the span exactly); ``overhead`` is the span's time with no
op on any thread (Python, dispatch, waiting: gaps in the timeline).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import re
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterable, Optional

# The categories, in the order the metrics are logged (profile_<category>_ms); ``overhead``
# is measured, never named by a rule.
CATEGORIES = ("matmul", "attention", "norm_elementwise", "optimizer", "overhead")
OP_CATEGORIES = CATEGORIES[:-1]  # what a framework's rule may name an op


@dataclasses.dataclass(frozen=True)
class Op:
    """One op interval of a trace, in ns: ``thread`` the timeline it ran on."""

    start: float
    end: float
    thread: str
    category: str


@dataclasses.dataclass(frozen=True)
class Split:
    """One profiled step: seconds in each category (``CATEGORIES``) and its wall span."""

    seconds: dict[str, float]
    step_s: float
    steps: int  # the steps profiled, of which this is the median by wall span
    profiler: str  # the fxtrack.profiler tag: which profiler, and how it was read
    timed_step_s: float  # the median of the same profiled calls by fxtrack's timer


def split(ops: Iterable[Op], trace: "Trace", profiler: str) -> Split:
    """The split of one profiled step, the median of the trace's step spans ((start, end) ns)
    by wall span (a busy machine's odd slow step is not the one reported), as the module
    docstring says; ops outside it are left out, ops crossing its edges are clipped."""
    spans = trace.spans
    if not spans:
        raise ValueError("the trace holds no annotated step")
    ops = list(ops)
    unknown = {o.category for o in ops} - set(OP_CATEGORIES)
    if unknown:
        raise ValueError(f"ops named categories outside {OP_CATEGORIES}: {sorted(unknown)}")
    lo, hi = sorted(spans, key=lambda s: s[1] - s[0])[(len(spans) - 1) // 2]
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    for cat, ns in _owned(ops, lo, hi).items():
        seconds[cat] = ns / 1e9
    seconds["overhead"] = (hi - lo) / 1e9 - sum(seconds.values())
    return Split(seconds, (hi - lo) / 1e9, len(spans), profiler,
                 statistics.median(trace.timed_s))


def _owned(ops: list[Op], lo: float, hi: float) -> dict[str, float]:
    """ns per category inside [lo, hi): the innermost op of each thread owns a piece, threads
    running at once share it equally."""
    inside = [o for o in ops if o.end > lo and o.start < hi and o.end > o.start]
    cuts = sorted({lo, hi, *(max(o.start, lo) for o in inside), *(min(o.end, hi) for o in inside)})
    by_thread: dict[str, list[Op]] = defaultdict(list)
    for o in inside:
        by_thread[o.thread].append(o)
    out: dict[str, float] = defaultdict(float)
    # per thread, the innermost (latest started, then shortest) op active in each piece
    owners: dict[str, list[Optional[str]]] = {}
    for thread, thread_ops in by_thread.items():
        thread_ops.sort(key=lambda o: (o.start, -o.end))
        cats: list[Optional[str]] = [None] * (len(cuts) - 1)
        for o in thread_ops:  # later-starting (nested) ops overwrite their parents
            a = bisect.bisect_left(cuts, max(o.start, lo))
            b = bisect.bisect_left(cuts, min(o.end, hi))
            cats[a:b] = [o.category] * (b - a)
        owners[thread] = cats
    for i in range(len(cuts) - 1):
        active = [cats[i] for cats in owners.values() if cats[i] is not None]
        for cat in active:
            out[cat] += (cuts[i + 1] - cuts[i]) / len(active)
    return out


# --- readers ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TraceEvent:
    """One event of a trace (an XSpace's, or torch.profiler's): its name, display name (TF: the
    op type; torch: ``kernel`` for a CUDA kernel), stats and the timeline it ran on."""

    name: str
    display: str
    stats: dict
    start: float  # ns
    end: float
    thread: str


def xplane_file(directory: Path) -> Path:
    """The one ``.xplane.pb`` a trace wrote under ``directory``."""
    found = sorted(Path(directory).rglob("*.xplane.pb"))
    if not found:
        raise RuntimeError(f"the profiler wrote no .xplane.pb under {directory}")
    return found[-1]


def xspace_events(path: Path, plane: str = "/host:CPU") -> list[TraceEvent]:
    """Every event of ``plane`` in the XSpace at ``path``, parsed with the XSpace protobuf that
    TensorFlow ships (``tensorflow.tsl.profiler.protobuf.xplane_pb2``)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(path).read_bytes())
    out = []
    for p in space.planes:
        if p.name != plane:
            continue
        meta, stat_meta = p.event_metadata, p.stat_metadata

        def value(s):  # an XStat's value: a string held by reference is a stat metadata's name
            kind = s.WhichOneof("value")
            return stat_meta[s.ref_value].name if kind == "ref_value" else getattr(s, kind)

        for line in p.lines:
            base = line.timestamp_ns
            for e in line.events:
                m = meta[e.metadata_id]
                stats = {stat_meta[s.metadata_id].name: value(s)
                         for s in (*m.stats, *e.stats) if s.WhichOneof("value")}
                start = base + e.offset_ps / 1e3
                out.append(TraceEvent(m.name, m.display_name, stats, start,
                                      start + e.duration_ps / 1e3, line.name))
    return out


def annotated_steps(events: Iterable[TraceEvent], name: str) -> list[tuple[float, float]]:
    """The (start, end) of each step annotation named ``name`` (the framework's own step
    marker: jax.profiler.StepTraceAnnotation, tf.profiler.experimental.Trace)."""
    return sorted((e.start, e.end) for e in events if e.name == name and "step_num" in e.stats)


# --- the profilers, each run over ``steps`` calls of ``step``, every call in a step annotation;
# each returns a Trace; the framework's rule names the categories of its events

STEP = "fxtrack_step"  # the step annotation's name


@dataclasses.dataclass(frozen=True)
class Trace:
    """What a profiler saw of ``steps`` profiled calls: each step annotation's (start, end) ns,
    the trace's events, and each call as fxtrack's timer saw it (s): the yardstick the
    annotated spans are checked against (an annotation that ended before the device finished
    would read short), taken from the same calls, so the same load."""

    spans: list[tuple[float, float]]
    events: list[TraceEvent]
    timed_s: list[float]


def _annotated_calls(step: Callable[[], object], steps: int,
                     annotation: Callable[[int], contextlib.AbstractContextManager]
                     ) -> list[float]:
    """``steps`` calls of ``step``, each in ``annotation(i)``, each timed around its annotation
    (``step`` returns once the device is done, as the timed window's steps do)."""
    timed = []
    for i in range(steps):
        t = time.perf_counter()
        with annotation(i):
            step()
        timed.append(time.perf_counter() - t)
    return timed


def jax_trace(step: Callable[[], object], steps: int) -> Trace:
    """``jax.profiler.trace``, read with JAX's own ``jax.profiler.ProfileData``: the executed
    XLA instructions (events with an ``hlo_op`` stat, named by it)."""
    import tempfile

    import jax
    from jax.profiler import ProfileData

    # JAX traces every Python call by default (python_tracer_level 1): that slows a
    # Python-heavy step (Keras' train_on_batch) and is not what the split reads
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0
    with tempfile.TemporaryDirectory() as directory:
        with jax.profiler.trace(directory, profiler_options=options):
            timed = _annotated_calls(
                step, steps, lambda i: jax.profiler.StepTraceAnnotation(STEP, step_num=i))
        data = ProfileData.from_file(str(xplane_file(Path(directory))))
    spans, events = [], []
    for plane in data.planes:
        for line in plane.lines:
            for e in line.events:
                stats = dict(e.stats)
                start, end = e.start_ns, e.start_ns + e.duration_ns
                if e.name == STEP and "step_num" in stats:
                    spans.append((start, end))
                elif "hlo_op" in stats:
                    events.append(TraceEvent(str(stats["hlo_op"]), "", stats, start, end,
                                             f"{plane.name}/{line.name}"))
    return Trace(sorted(spans), events, timed)


def tf_trace(step: Callable[[], object], steps: int) -> Trace:
    """``tf.profiler.experimental`` start/stop with a ``Trace`` step annotation per step, the
    XSpace read by ``xspace_events``: every event of the host plane."""
    import tempfile

    import tensorflow as tf

    with tempfile.TemporaryDirectory() as directory:
        tf.profiler.experimental.start(directory)
        try:
            timed = _annotated_calls(
                step, steps, lambda i: tf.profiler.experimental.Trace(STEP, step_num=i, _r=1))
        finally:
            tf.profiler.experimental.stop()
        events = xspace_events(xplane_file(Path(directory)))
    return Trace(annotated_steps(events, STEP), events, timed)


def torch_trace(step: Callable[[], object], steps: int, gpu: bool) -> Trace:
    """``torch.profiler.profile`` (CPU activity; CUDA's too on a GPU) with a ``record_function``
    per step, read from its own event list (``prof.events()``): each op's interval and thread,
    ``stats["names"]`` its name and its ancestors' (``cpu_parent``); a CUDA kernel as an event
    on its device's timeline with its launching op's names."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        timed = _annotated_calls(step, steps, lambda i: record_function(STEP))
    spans, events = [], []
    cpu = torch.autograd.DeviceType.CPU
    for e in prof.events():
        if e.device_type != cpu:
            continue
        start, end = e.time_range.start * 1e3, e.time_range.end * 1e3  # us -> ns
        if e.name == STEP:
            spans.append((start, end))
            continue
        names, parent = [e.name], e.cpu_parent
        while parent is not None:
            names.append(parent.name)
            parent = parent.cpu_parent
        events.append(TraceEvent(e.name, "", {"names": names}, start, end, f"thread {e.thread}"))
        for k in e.kernels:
            events.append(TraceEvent(k.name, "kernel", {"names": names},
                                     k.time_range.start * 1e3, k.time_range.end * 1e3,
                                     f"cuda:{k.device}"))
    return Trace(sorted(spans), events, timed)


_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\) -> .* \{$")
_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = \S+(?:\s\S+)*? ([\w\-]+)\(")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def hlo_ops(text: str) -> dict[str, list[tuple[str, str]]]:
    """An optimised HLO module's text -> for each instruction name, the (opcode, op_name) of
    every instruction it runs: itself and, for a fusion or call, the computations it calls
    (so a fusion the trace names ``ynn_fusion.3`` reads as the dot inside it)."""
    computations: dict[str, list[tuple[str, str, str, list[str]]]] = {}
    current: Optional[str] = None
    for line in text.splitlines():
        header = _HEADER.match(line.strip())
        if header:
            current = header.group(1)
            computations[current] = []
            continue
        m = _INSTR.match(line)
        if current is not None and m:
            name_meta = _OP_NAME.search(line)
            computations[current].append((m.group(1), m.group(2),
                                          name_meta.group(1) if name_meta else "",
                                          _CALLS.findall(line)))

    def expand(comp: str, seen: frozenset) -> list[tuple[str, str]]:
        out = []
        for _, opcode, op_name, calls in computations.get(comp, ()):
            out.append((opcode, op_name))
            for c in calls:
                if c not in seen:
                    out += expand(c, seen | {c})
        return out

    ops: dict[str, list[tuple[str, str]]] = {}
    for comp, instrs in computations.items():
        for name, opcode, op_name, calls in instrs:
            ops[name] = [(opcode, op_name)] + [x for c in calls for x in expand(c, frozenset({c}))]
    return ops


def hlo_rule(ops: dict[str, list[tuple[str, str]]], attention: re.Pattern,
             optimizer: re.Pattern) -> Callable[[str], str]:
    """The category rule of an XLA program (JAX's, TensorFlow's under XLA), by what each
    executed instruction runs (``hlo_ops``): attention where an op_name lies in a scope
    ``attention`` matches; else matmul where it runs a dot or convolution; else optimizer where
    an op_name lies in a scope ``optimizer`` matches; the rest norm_elementwise. An instruction missing from the module falls to its
    name (``instruction_category``)."""
    def category(name: str) -> str:
        inside = ops.get(name)
        if inside is None:
            return instruction_category(name)
        names = [n for _, n in inside if n]
        if any(attention.search(n) for n in names):
            return "attention"
        if any(op in ("dot", "convolution") for op, _ in inside):
            return "matmul"
        if any(optimizer.search(n) for n in names):
            return "optimizer"
        return "norm_elementwise"
    return category


# --- rules shared by two frameworks (each framework package stands alone, so they live here) ---

def instruction_category(name: str) -> str:
    """An XLA instruction by its name alone, where the program's HLO is out of reach (Keras'
    own compiled step): matmul for dots, convolutions and XLA:CPU's YNNPACK dot fusions
    (``ynn_fusion``), the rest norm_elementwise; attention and the optimiser are not told
    apart from them."""
    return "matmul" if re.search(r"dot|convolution|ynn_fusion|matmul", name, re.I) else \
        "norm_elementwise"


# Keras models on TensorFlow (framework=tensorflow, and keras on its TensorFlow backend): the
# scopes Keras' optimisers run under (AdamW's adam_w, fxtrack's CoupledSGD's coupled_sgd);
# Keras' ops.dot_product_attention runs tf.einsum and tf.nn.softmax (named einsum*/ and
# Softmax; no other op of fxtrack's Keras models is one)
TF_OPTIMIZERS = ("adam_?w", "adam", "sgd", "coupled_sgd")
TF_ATTENTION = re.compile(r"(^|/)einsum(_\d+)?/|(^|/)Softmax(/|$)")
TF_MATMUL_TYPES = re.compile(r"MatMul|Conv|Einsum")


def tf_optimizer_scope(name: str) -> re.Pattern:
    """TF op names under a Keras optimiser's scope (``name``, the optimiser's, or a known one)."""
    names = "|".join((re.escape(name), *TF_OPTIMIZERS))
    return re.compile(rf"^(gradient_tape/)?({names})(_\d+)?/", re.I)


def tf_graph_op(e: TraceEvent) -> bool:
    """A TF op's event (``scope/name:Type``, its type the display name), not a function call's
    (``__inference_step_N``)."""
    return bool(e.display) and ":" in e.name and not e.display.startswith("__")


def tf_graph_category(e: TraceEvent, optimizer: re.Pattern) -> str:
    """A tf.function graph op's category: optimizer under ``optimizer``'s scope, attention
    (``TF_ATTENTION``), matmul by op type (MatMul, BatchMatMul, Conv, Einsum), else
    norm_elementwise."""
    name = e.name.partition(":")[0]
    if optimizer.search(name):
        return "optimizer"
    if TF_ATTENTION.search(name):
        return "attention"
    if TF_MATMUL_TYPES.search(e.display):
        return "matmul"
    return "norm_elementwise"


# torch's aten ops (framework=torch, and keras on its torch backend), by an op's name and its
# ancestors' (the op first)
ATEN_MATMUL = re.compile(r"aten::(mm|addmm|bmm|baddbmm|matmul|linear|einsum|conv\w*|"
                         r"_convolution\w*|mkldnn_\w*conv\w*)$|"
                         r"(Mm|Addmm|Bmm|Baddbmm|Convolution\w*)Backward\d*$")
ATEN_ATTENTION = re.compile(r"scaled_dot_product|ScaledDotProduct|flash_attention|"
                            r"efficient_attention")
TORCH_OPTIMIZER = re.compile(r"^Optimizer\.step#")  # torch.optim's own annotation
_NOT_AN_OP = re.compile(r"^autograd::engine::|^Optimizer\.")


def aten_category(names: list[str]) -> str:
    """optimizer inside torch.optim's ``Optimizer.step#`` annotation; attention inside
    scaled_dot_product_attention (its backward node, its kernels); matmul for mm, addmm, bmm,
    baddbmm, matmul, linear, einsum, conv* and their backward nodes; else norm_elementwise."""
    if any(TORCH_OPTIMIZER.search(n) for n in names):
        return "optimizer"
    if any(ATEN_ATTENTION.search(n) for n in names):
        return "attention"
    if any(ATEN_MATMUL.search(n.split(": ")[-1]) for n in names):  # evaluate_function: XBackward0
        return "matmul"
    return "norm_elementwise"


def torch_op(e: TraceEvent) -> bool:
    """A dispatcher op (``aten::``, ``mkldnn::``...) or a CUDA kernel: covered time; the
    autograd engine's and torch.optim's annotations are ancestry only."""
    return e.display == "kernel" or ("::" in e.name and not _NOT_AN_OP.search(e.name))
