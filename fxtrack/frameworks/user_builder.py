"""model=custom without any framework imported: the user's builder found, called and its return
value checked, the levers an arbitrary model cannot take, and the small tree helpers every
framework's ``user_model`` capability shares (inputs may be one array, a tuple or a dict).

The builder contract (docs/your-own-model.md): ``FUNC(batch_size=B, seed=S, **model.kwargs)``
returns ``(model, (inputs, targets), loss_fn)`` in the framework's own types, and
``loss_fn(outputs, targets)`` is a scalar. Every broken promise is a ``NotSupported`` with one
line saying what was expected: the cell is "not supported", never a crash mid-window.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any, Callable, Iterable, Optional

from fxtrack.architectures import Arch
from fxtrack.families.user import OPTIMIZERS  # noqa: F401  (model.optimizer's choices)
from fxtrack.frameworks.declaration import (CUSTOM_LIFTED_BY, CUSTOM_UNSUPPORTED, Framework,
                                            NotSupported)

KINDS = ("plain", "lm")  # model.kind: lm is measured in tokens, as fxtrack's own LMs are


def refusal(scenario: str, memory: str, parallel: str,
            has: Callable[[str], bool] = lambda capability: False) -> Optional[str]:
    """Why model=custom cannot run with these levers (CUSTOM_UNSUPPORTED), or None.
    ``has``: whether the framework declares a capability; one named in CUSTOM_LIFTED_BY lifts
    its entry (e.g. ``user_serving_export``: scenario=checkpoint for a user's model).
    A runtime, int8 and scenario=pipeline are refused by the framework's declared deployment
    capabilities (one for every family), its limits and its ``pipeline``
    (fxtrack.scenarios.rules)."""
    # the table names the scenarios it refuses (scenario=serve): looked up, never compared
    asked = {"memory=checkpoint": memory == "checkpoint", "parallel=fsdp": parallel == "fsdp",
             f"scenario={scenario}": True}
    for what, hit in asked.items():
        if what not in CUSTOM_UNSUPPORTED:
            continue
        if hit and not (what in CUSTOM_LIFTED_BY and has(CUSTOM_LIFTED_BY[what])):
            return f"{what} is not supported for model=custom: {CUSTOM_UNSUPPORTED[what]}"
    return None


def builder_path(arch: Arch, framework: Framework) -> str:
    """The ``"package.module:function"`` this framework's worker calls; NotSupported if unset."""
    key = framework.builder_key
    path = arch.dims.get(key)
    if not path:
        raise NotSupported(f"model.{key} is not set: framework={framework.name} with "
                           f"model=custom needs model.{key}=package.module:function")
    if path.count(":") != 1 or not all(path.split(":")):
        raise NotSupported(f"model.{key}={path} must be 'package.module:function'")
    return path


def missing_module(path: str) -> Optional[str]:
    """Why the builder's module cannot be found (without importing it or any framework), or
    None. Used by the orchestrator for a one-line refusal within seconds."""
    module = path.partition(":")[0]
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as e:  # a missing parent package raises, not None
        found, why = None, str(e)
    else:
        why = ""
    if found is None:
        return f"no module named {module!r} is importable{f' ({why})' if why else ''}"
    return None


def load(path: str, key: str) -> Callable[..., Any]:
    """The builder function behind ``model.<key>=path``."""
    module, _, name = path.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise NotSupported(f"model.{key}={path}: module {e.name!r} is not importable by "
                           f"{sys.executable} (is it on PYTHONPATH?)") from None
    func = getattr(mod, name, None)
    if not callable(func):
        raise NotSupported(f"model.{key}={path}: module {module} has no function {name!r}")
    return func


# The memory pre-check's shape-only build asks for this batch: not 1, so that a builder that
# ignores batch_size (a fixed leading axis, 1 included) is caught there, before any work.
ABSTRACT_BATCH = 2


def call(arch: Arch, framework: Framework, batch_size: int, seed: int) -> tuple[Any, Any, Any, Any]:
    """Call the builder; (model, inputs, targets, loss_fn) once the shape of its answer is right."""
    key = framework.builder_key
    path = builder_path(arch, framework)
    out = load(path, key)(batch_size=batch_size, seed=seed, **dict(arch.kwargs or {}))
    expected = "must return (model, (inputs, targets), loss_fn)"
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise NotSupported(f"model.{key}={path} {expected}; got {describe(out)}")
    model, data, loss_fn = out
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise NotSupported(f"model.{key}={path} {expected}; its second item is "
                           f"{describe(data)}, not an (inputs, targets) pair")
    if not callable(loss_fn):
        raise NotSupported(f"model.{key}={path} {expected}; its loss_fn is {describe(loss_fn)}")
    # every figure per sample (and scenario=fit's search) needs the batch it asked for
    for leaf in leaves(data[0]):
        shape = getattr(leaf, "shape", None)
        if shape is not None and len(shape) > 0 and shape[0] != batch_size:
            raise NotSupported(f"model.{key}={path} ignores batch_size: its inputs' leading "
                               f"axis is {shape[0]}, not batch_size={batch_size}")
    return model, data[0], data[1], loss_fn


def sequence_length(arch: Arch, framework: Framework, inputs: Any) -> Optional[int]:
    """model.kind=lm: the tokens per sample, the size of the first input's axis
    ``model.seq_axis`` (a dict's first value, e.g. ``input_ids``); None for a plain model.
    NotSupported when that input has no such axis (before any timed work)."""
    if arch.dims.get("kind", "plain") != "lm":
        return None
    axis = int(arch.dims.get("seq_axis", 1))
    first = leaves(inputs)[0] if leaves(inputs) else None
    shape = tuple(getattr(first, "shape", ()))
    if len(shape) <= axis:
        key = framework.builder_key
        raise NotSupported(f"model.kind=lm needs a sequence axis model.seq_axis={axis} in the "
                           f"first input of model.{key}={arch.dims.get(key)}; its shape is "
                           f"{shape}")
    return int(shape[axis])


# model.shard_modules / model.remat_modules: class names of the user's submodules (parallel=fsdp's
# sharding units, memory=checkpoint's recomputed blocks); empty: the first repeated container.
POLICY_KEYS = {"shard_modules": "parallel=fsdp", "remat_modules": "memory=checkpoint"}


def policy_blocks(arch: Arch, framework: Framework, model: Any, key: str,
                  children: Callable[[Any], Iterable[tuple[Any, Any]]],
                  is_container: Callable[[Any], bool]) -> list[Any]:
    """The submodules of the user's ``model`` that ``model.<key>`` names (every module of those
    classes; remat_modules: the outermost ones, a block inside a recomputed block is recomputed
    already), or by default the items of the first container (pre-order, ``is_container``) that
    holds 2 or more submodules all of one class: a model's repeated blocks. ``children(m)``:
    the (name, submodule) pairs under ``m``. NotSupported, in one line, for a class name the
    model does not have, and for memory=checkpoint on a model with no blocks to recompute
    (parallel=fsdp then shards the model as one unit)."""
    modules = _submodules(model, children)
    names = tuple(arch.dims.get(key) or ())
    builder = f"model.{framework.builder_key}={arch.dims.get(framework.builder_key)}"
    if names:
        present = {type(m).__name__ for _, m in modules}
        unknown = [n for n in names if n not in present]
        if unknown:
            raise NotSupported(f"model.{key} names {', '.join(unknown)}, no class of the model "
                               f"of {builder} (its classes: {', '.join(sorted(present))})")
        chosen = [(path, m) for path, m in modules if type(m).__name__ in names]
    else:
        chosen = next(([(path + (k,), c) for k, c in children(m)] for path, m in modules
                       if is_container(m) and _repeated([c for _, c in children(m)])), [])
    if key == "remat_modules":
        paths = [path for path, _ in chosen]
        chosen = [(path, m) for path, m in chosen
                  if not any(p != path and path[:len(p)] == p for p in paths)]
        if not chosen:
            raise NotSupported(f"memory=checkpoint found no blocks to recompute in the model of "
                               f"{builder}: no container of 2 or more submodules of one class; "
                               f"name them with model.remat_modules=[ClassName]")
    return [m for _, m in chosen]


def _submodules(root: Any, children: Callable[[Any], Iterable[tuple[Any, Any]]]
                ) -> list[tuple[tuple, Any]]:
    """(path, module) for ``root`` and every submodule under it, pre-order, each once (a shared
    module where it is first met)."""
    out: list[tuple[tuple, Any]] = []
    seen: set[int] = set()
    stack: list[tuple[tuple, Any]] = [((), root)]
    while stack:
        path, module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        out.append((path, module))
        stack.extend(reversed([(path + (k,), c) for k, c in children(module)]))
    return out


def _repeated(items: list[Any]) -> bool:
    return len(items) >= 2 and len({type(x) for x in items}) == 1


def expect(ok: bool, arch: Arch, framework: Framework, what: str, wanted: str, got: Any) -> None:
    """NotSupported naming the builder, what it returned and what this framework needs."""
    if not ok:
        key = framework.builder_key
        raise NotSupported(f"model.{key}={arch.dims.get(key)} returned {what} of type "
                           f"{describe(got)}; framework={framework.name} needs {wanted}")


def describe(obj: Any) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}".removeprefix("builtins.")


def leaves(tree: Any) -> list[Any]:
    """The arrays of one array, a tuple / list or a dict (one level: what the contract allows)."""
    if isinstance(tree, dict):
        return list(tree.values())
    if isinstance(tree, (tuple, list)):
        return list(tree)
    return [tree]


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: fn(v) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return tuple(fn(v) for v in tree)
    return fn(tree)


def apply(model: Any, inputs: Any, **kwargs: Any) -> Any:
    """The model on its inputs: ``model(x)``, ``model(*inputs)`` or ``model(**inputs)``."""
    if isinstance(inputs, dict):
        return model(**inputs, **kwargs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs, **kwargs)
    return model(inputs, **kwargs)


def keras_inputs(inputs: Any) -> Any:
    """Keras takes several inputs as one list (or dict) argument."""
    return list(inputs) if isinstance(inputs, tuple) else inputs


def named_inputs(inputs: Any) -> dict[str, Any]:
    """The inputs by the names an exported graph gives them: a dict's keys, ``input_0``,
    ``input_1``, ... for a tuple, ``input`` for one array (model=custom's deployment exports)."""
    if isinstance(inputs, dict):
        return dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return {f"input_{i}": x for i, x in enumerate(inputs)}
    return {"input": inputs}


def root_cause(error: BaseException) -> BaseException:
    """The innermost ``__cause__`` of ``error`` (the exporter's own error under its wrappers)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def root_reason(error: BaseException, limit: int = 300) -> str:
    """``Type: first line`` of the innermost cause (``limit`` characters of it): the op an
    exporter stopped at."""
    root = root_cause(error)
    lines = [line.strip() for line in str(root).splitlines() if line.strip()]
    return f"{type(root).__name__}: {(lines or [''])[0][:limit]}"


def exporter_refusal(what: str, exporter: str, arch: Arch, framework: Framework,
                     error: BaseException | dict[str, BaseException]) -> NotSupported:
    """An exporter that cannot convert the model (a user's, ``model.<key>=<builder>``, or
    fxtrack's own, ``model=<name>``): a not-supported cell quoting the exporter's own error
    (root_reason), not a crash. ``error`` may be each path's error by name (every one tried
    refused): each reason is quoted after its name."""
    key = framework.builder_key
    model = f"model.{key}={arch.dims[key]}" if arch.dims.get(key) else f"model={arch.name}"
    # several reasons share the one line a failed run keeps (500 characters): each shorter
    why = ("; ".join(f"{path}: {root_reason(e, 150)}" for path, e in error.items())
           if isinstance(error, dict) else root_reason(error))
    return NotSupported(f"{what} is not supported by {exporter} for {model}: {why}")
