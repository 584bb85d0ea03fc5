"""The optional capabilities a framework may declare (``Framework.capabilities``), each a
``typing.Protocol`` that the module the framework names for it satisfies structurally (PEP 544:
a module's functions stand for the protocol's methods, ``self`` dropped). Every function takes
the built Backend first. A module is checked against its protocol by ``mismatches``: on the
imported module when a scenario asks for it (``Framework.capability``), and on its source,
without importing the framework, for every declared module (tests/test_contract.py).

This module imports no framework; ``backend`` is typed ``Any`` here because
``fxtrack.frameworks.base`` imports the declarations (each framework's own modules annotate it
with their Backend class).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import ModuleType
from typing import (TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Mapping, Optional,
                    Protocol, Sequence)

if TYPE_CHECKING:
    from fxtrack.frameworks.decoding import Decoder

# A forward step on the resident batch: returns when the device has finished.
Step = Callable[[], None]


class Inference(Protocol):
    """scenario=inference (and the checkpoint scenario's live model): the built model in
    inference mode."""

    def prepare(self, backend: Any) -> Step:
        """A forward-only step on the resident batch."""


class Pipeline(Protocol):
    """scenario=pipeline: training fed by the framework's own input pipeline from files."""

    def loader(self, backend: Any, directory: Path, batch_size: int,
               workers: int) -> Iterator[Any]:
        """Endless batches of ``batch_size`` read from ``directory`` by ``workers`` workers."""

    def train_step_on(self, backend: Any, batch: Any) -> Any:
        """One training step on a loader batch; a loss handle (``Backend.loss_value``)."""

    def user_dataset(self, backend: Any, samples: int) -> tuple[Path, str]:
        """model=custom: the user's own batch written as ``samples`` records in the framework's
        record format; (their directory, the format's name)."""


class Checkpoint(Protocol):
    """scenario=checkpoint: the full training state saved and restored."""

    def save(self, backend: Any, directory: Path) -> None:
        """The training state (parameters, optimiser, RNG state) written under ``directory``."""

    def restore(self, backend: Any, directory: Path) -> None:
        """The state in ``directory`` assigned to the live model, in place."""


class ServingExport(Protocol):
    """scenario=checkpoint: the model saved for serving in the framework's own format."""

    def export(self, backend: Any, directory: Path) -> Step:
        """Exported into ``directory``, loaded back: a forward step of the loaded model."""


class OnnxExport(Protocol):
    """runtime=onnxruntime|openvino|tensorrt: the model exported to ONNX, its inputs by name
    (``user_builder.named_inputs``: ``input`` for one array), its floating outputs in order."""

    def reference(self, backend: Any) -> tuple[dict[str, Any], list[Any]]:
        """(inputs by name, the live model's floating outputs), inference mode: the exported
        file's outputs are compared to these."""

    def to_onnx(self, backend: Any, path: Path, tags: Optional[dict[str, str]] = None) -> Path:
        """The ONNX file written at ``path`` (NotSupported with the exporter's reason; a
        package the exporter lacks is an ImportError naming it); ``tags``, where given, gets
        ``onnx_exporter``: which exporter wrote it."""


class TfliteExport(Protocol):
    """runtime=tflite: the model converted to a TFLite flatbuffer (inputs by name, floating
    outputs ``output_0``, ``output_1``, ...)."""

    def reference(self, backend: Any) -> tuple[dict[str, Any], list[Any]]:
        """(inputs by name, the live model's floating outputs), inference mode."""

    def to_tflite(self, backend: Any, path: Path, quantize: bool) -> Path:
        """The .tflite file written at ``path``, dynamic-range int8 when ``quantize`` asks."""


class NativeInt8(Protocol):
    """quantize=dynamic_int8 runtime=native: the framework's own dynamic int8 quantisation."""

    def reference(self, backend: Any) -> tuple[dict[str, Any], list[Any]]:
        """(inputs by name, the live model's floating outputs), inference mode."""

    def quantize_native(self, backend: Any) -> Callable[[dict[str, Any]], list[Any]]:
        """forward(inputs by name) -> the quantised model's floating outputs."""


class ShardedState(Protocol):
    """parallel=fsdp: parameters, gradients and optimiser state sharded over the devices. A
    marker with no function: ``Backend.build`` shards when ``spec.parallel`` asks (the declared
    module holds that code); declaring it says the build has the path, and lacking it refuses
    parallel=fsdp before any work."""


class Remat(Protocol):
    """memory=checkpoint: activations recomputed per block. A marker with no function:
    ``Backend.build`` applies it when ``spec.memory`` asks (the declared module holds that
    code); lacking it refuses memory=checkpoint before any work."""


class Calibration(Protocol):
    """The peak FLOP/s yardstick for MFU: a large square matmul timed at the spec's
    precision."""

    def matmul_tflops(self, backend: Any) -> float:
        """The matmul's TFLOP/s."""


class Generate(Protocol):
    """scenario=generate: the built language model's greedy decoding with a KV cache
    (fxtrack.frameworks.decoding)."""

    def prepare(self, backend: Any, prompt_len: int, new_tokens: int) -> Decoder:
        """A decoder for prompts of ``prompt_len`` tokens and ``new_tokens`` more."""


class ServeBuckets(Protocol):
    """scenario=serve's ``scenario.batch_buckets``: steps prepared per batch size, and the
    compilations they cost (a module whose ``compiles`` returns None says why in its
    ``NOT_COUNTED``)."""

    def resident(self, backend: Any, batch_size: int) -> ContextManager[None]:
        """Within it, the resident batch has ``batch_size`` samples while an inference step or
        a decoder is prepared on it."""

    def compiles(self, backend: Any) -> Optional[int]:
        """Compilations so far in this process; None where the framework cannot count them."""


class SlotDecode(Protocol):
    """scenario=serve's ``scenario.batching=continuous``: a decoder per KV-cache slot (each slot
    its own cache position; a request prefilled into a free slot while the others decode;
    shapes padded to declared buckets), fxtrack.scenarios.batching.SlotDecoder."""

    def prepare_slots(self, backend: Any, slots: int, prompt_buckets: Sequence[int],
                      longest: int) -> Any:
        """A SlotDecoder of ``slots`` slots, each prompt padded to the smallest of
        ``prompt_buckets`` that holds it, up to ``longest`` new tokens."""


class UserServingExport(Protocol):
    """model=custom's serving export (scenario=checkpoint)."""

    def export(self, backend: Any, directory: Path) -> Step:
        """The user's model exported into ``directory`` and loaded back: a forward step."""

    def export_error(self, backend: Any) -> float:
        """The loaded model's outputs' relative error against the live model's."""


class UserShardedState(Protocol):
    """parallel=fsdp for model=custom: the user's model sharded by a generic policy or
    model.shard_modules. A marker with no function: ``user_model.build`` shards."""


class UserRemat(Protocol):
    """memory=checkpoint for model=custom: the blocks of a generic policy or
    model.remat_modules recomputed in backward. A marker with no function: ``user_model.build``
    wraps them."""


class UserModel(Protocol):
    """model=custom: the user's builder (``model.<Framework.model_key>``) called and checked,
    trained and measured as the framework's own models are."""

    def build(self, backend: Any, batch_size: int) -> None:
        """The builder called and checked; its model, optimiser, batch and step set on the
        backend as the backend's own build sets them."""

    def prepare_inference(self, backend: Any) -> Step:
        """scenario=inference: a forward step of the user's model."""

    def train_flops_per_sample(self, backend: Any) -> tuple[float, str]:
        """(FLOPs of one training step per sample, the framework counter that counted them)."""

    def forward_flops_per_sample(self, backend: Any) -> tuple[float, str]:
        """(FLOPs of one forward per sample, the counter)."""

    def abstract_param_count(self, backend: Any) -> int:
        """The trainable parameters of a shape-only build (the memory pre-check, python -m
        fxtrack.worker --params)."""


class Converge(Protocol):
    """scenario=converge: optimiser steps on host batches of real data at a scheduled learning
    rate, and the model's outputs on held-out batches."""

    def train_on_host(self, backend: Any, batch: dict, lr: float) -> Any:
        """One optimiser step at learning rate ``lr`` on a NumPy batch (fxtrack.data.batch);
        a loss handle for ``backend.loss_value``."""

    def outputs(self, backend: Any, batch: dict) -> Any:
        """The model's logits on a NumPy batch, as a NumPy float32 array (no gradient, the
        model in inference mode)."""

    def weights(self, backend: Any) -> dict:
        """The trained parameters as NumPy arrays under PyTorch's names and layout (the shared
        start's, fxtrack.frameworks.initial): what a converge run keeps."""

    def load_weights(self, backend: Any, path: str) -> None:
        """The parameters saved at ``path`` (``initial.save``) assigned to the built model."""

    def exported_input(self, backend: Any, batch: dict) -> Any:
        """A NumPy batch as the model's exports take it (the layout of ``onnx_export``'s
        ``reference`` ``input``: NCHW images for torch, NHWC elsewhere, or token ids)."""


class ConvergeDevices(Protocol):
    """scenario=converge on more than one device: the global host batch split over them in
    order and the shared start given to replicated or sharded (parallel=fsdp) parameters, so
    the losses are the global batch's. A marker with no function: ``converge``'s functions do
    it."""


class Profile(Protocol):
    """scenario=train's ``scenario.profile_steps``: a few training steps under the framework's
    own profiler, after the timed window, their time split into fixed categories
    (fxtrack.frameworks.profiling)."""

    def split_steps(self, backend: Any, steps: int) -> Any:
        """A ``profiling.Split``: seconds per step in each of ``profiling.CATEGORIES`` and the
        profiled steps' wall span, over ``steps`` profiled steps."""


# capability name -> its protocol (Framework.capabilities names a module for each it has)
PROTOCOLS: dict[str, type] = {
    "inference": Inference, "pipeline": Pipeline, "checkpoint": Checkpoint,
    "serving_export": ServingExport, "onnx_export": OnnxExport, "tflite_export": TfliteExport,
    "native_int8": NativeInt8, "sharded_state": ShardedState, "remat": Remat,
    "calibration": Calibration, "generate": Generate, "serve_buckets": ServeBuckets,
    "slot_decode": SlotDecode,
    # Twins left apart (the deployment exports are one capability each, for every family):
    # the user's serving export also measures its error (export_error, a metric fxtrack's own
    # checkpoint runs do not log) and may be refused by its exporter without failing the run
    "user_serving_export": UserServingExport,
    # a user's model is sharded / rematerialised by a generic block policy inside
    # user_model.build, fxtrack's own models by their builders' own path: two mechanisms
    "user_sharded_state": UserShardedState, "user_remat": UserRemat,
    "user_model": UserModel, "converge": Converge, "converge_devices": ConvergeDevices,
    "profile": Profile,
}

# A function's parameters as (name, has a default), in order; None: the name is bound in the
# module but not as a function it defines.
Params = Optional[tuple[tuple[str, bool], ...]]


def meaning(protocol: type) -> str:
    """The protocol's docstring as one line: what the capability is for."""
    return " ".join(inspect.cleandoc(protocol.__doc__ or "").split())


def functions(protocol: type) -> dict[str, tuple[tuple[str, bool], ...]]:
    """What a module providing ``protocol`` must define: name -> parameters, ``self`` dropped."""
    return {name: _params(inspect.signature(fn))[1:] for name, fn in vars(protocol).items()
            if inspect.isfunction(fn) and not name.startswith("_")}


def mismatches(protocol: type, defined: Mapping[str, Params]) -> list[str]:
    """How a module's top-level ``defined`` functions (``module_functions`` or
    ``source_functions``) fall short of ``protocol``: each missing function, each defined with
    other parameters (the protocol's must come first, by name; any more need a default)."""
    problems = []
    for name, wanted in functions(protocol).items():
        call = f"{name}({', '.join(n for n, _ in wanted)})"
        if name not in defined:
            problems.append(f"lacks {call}")
        elif defined[name] is None:
            problems.append(f"binds {name} but defines no function {call}")
        else:
            have = defined[name]
            names = [n for n, _ in have[:len(wanted)]]
            extra = [n for n, default in have[len(wanted):] if not default]
            if names != [n for n, _ in wanted] or extra:
                problems.append(f"defines {name}({', '.join(n for n, _ in have)}), not {call}")
    return problems


def module_functions(module: ModuleType) -> dict[str, Params]:
    """An imported module's top-level names: each function's parameters, None for the rest."""
    return {name: _signature(value) for name, value in vars(module).items()}


def source_functions(source: str) -> dict[str, Params]:
    """A module's top-level names read from its source (no import): each ``def``'s parameters,
    None for names it binds otherwise (assignments, imports, classes)."""
    found: dict[str, Params] = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            first_default = len(positional) - len(args.defaults)
            found[node.name] = (
                tuple((a.arg, i >= first_default) for i, a in enumerate(positional))
                + tuple(("*" + a.arg, d is not None)
                        for a, d in zip(args.kwonlyargs, args.kw_defaults)))
        elif isinstance(node, ast.ClassDef):
            found.setdefault(node.name, None)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                found.setdefault((alias.asname or alias.name).split(".")[0], None)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        found.setdefault(name.id, None)
    return found


def _signature(value: Any) -> Params:
    if not callable(value) or inspect.isclass(value):
        return None
    try:
        return _params(inspect.signature(value))
    except (TypeError, ValueError):  # a builtin without a readable signature
        return None


def _params(signature: inspect.Signature) -> tuple[tuple[str, bool], ...]:
    # Positional parameters, then keyword-only ones as "*name" (they cannot fill a protocol's
    # positional parameter; a required one cannot be left out).
    return tuple(("*" + p.name if p.kind is p.KEYWORD_ONLY else p.name,
                  p.default is not p.empty)
                 for p in signature.parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
