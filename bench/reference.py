"""fxtrack's models against the public implementation a user would pick in the same framework,
each trained with the same batch, optimiser (AdamW / SGD as fxtrack uses) and precision, one
process per arm, in rotated rounds; a ratio >= 1 means fxtrack trains at least as fast.
Every row runs at each of ``--precisions`` (default ``fp32,bf16``): at bf16 every arm is in bf16
mixed precision (fxtrack's ``precision=bf16``; the torch references under
``torch.autocast("cpu", bfloat16)`` around the forward and loss, as fxtrack's torch step; the
Keras references built under Keras' ``mixed_bfloat16`` policy, as fxtrack's Keras models are).

Rows (model, framework) and their references, all built from explicit arguments (no download):
  vit / bert       torch       Hugging Face ``ViTForImageClassification`` / ``BertForMaskedLM``
                               (SDPA attention), eager and ``torch.compile``
  resnet50         torch       ``torchvision.models.resnet50`` (v1.5), eager and ``torch.compile``
  resnet50         tensorflow  ``keras.applications.ResNet50`` (v1: its stride sits on the first
                               1x1 conv, ~3% fewer FLOPs, which flatters the reference slightly),
                               ``tf.function`` and XLA
  resnet50         jax         the same ``keras.applications.ResNet50`` on Keras' JAX backend (no
                               public Flax ResNet-50 installs here: transformers 5 dropped Flax),
                               the same optimiser and loss, Keras' default (jit) and
                               ``jit_compile=True``
  vit / bert       tensorflow  keras-hub ``ViTBackbone`` + a dense head on the class token /
                   jax         ``BertBackbone`` + keras-hub's ``MaskedLMHead`` (as ``BertMaskedLM``:
                               dense, GELU, LayerNorm, the tied embedding, a bias) on every
                               position, as fxtrack's and Hugging Face's heads score them, on the
                               Keras backend of that framework, ``compile(jit_compile="auto")``
                               (Keras' default) and ``jit_compile=True``
  llama            torch       Hugging Face ``LlamaForCausalLM`` (SDPA), eager and ``torch.compile``
  llama            tensorflow  keras-hub ``LlamaBackbone`` + its (reversible) token embedding as
                   jax         the output projection, as keras-hub's ``Llama3CausalLM`` computes
                               its logits, Keras' default and ``jit_compile=True``
  all four models  keras       fxtrack's Keras-3 path (``framework=keras``,
                   on each     ``framework.keras_backend=<backend>``; rows
                   backend     ``<model>-keras-<backend>``) against the same keras-hub /
                               ``keras.applications`` reference as above, on that backend; on
                               torch Keras' default is eager and ``jit_compile=True`` is
                               ``torch.compile`` of the step (mode ``compile``)

Every row times fxtrack at its default (``framework.compile=auto``) against the reference at its
best mode (``--modes all`` adds fxtrack with ``framework.compile=true`` and the reference's
default mode). Each arm is a process of its own (Keras' backend is per process), started,
built and warmed up one at a time, then timed ``--steps`` steps per round, the arms' order
rotated round to round, while the others wait. Reported: each arm's median samples/s with the
95% t interval of the mean log throughput, and each arm's ratio to the reference's best per
round (paired), its median and the 95% t interval of the mean log ratio (fxtrack/stats.py).
``--control`` adds the reference's best once more, in a process of its own: its ratio is what
two processes of one model read apart here, the floor under any other arm's difference.

    pip install transformers keras-hub          # the references; torchvision for ResNet-50 (torch)
    # no CPU torchvision for torch 2.13 on this index: its CUDA wheel's model code, off the venv
    pip install --no-deps --target /tmp/tvpkg torchvision && export PYTHONPATH=/tmp/tvpkg
    python bench/reference.py [--rounds 5] [--only vit-tensorflow,bert-jax] [--modes all]
    python bench/reference.py --only '*-keras-*,resnet50-jax' --precisions bf16   # patterns
    python bench/reference.py --quick           # every row at tiny widths: a smoke run

A reference that is not installed makes its row say so instead of failing; so does an arm whose
process fails (its traceback on stderr), and the rows after it still run.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
ROUNDS, WARMUP, STEPS, BATCH = 5, 2, 8, 8
BATCHES = {"llama": 4}  # a model's own default batch (issue 35's Llama config), else BATCH
# Small but real: full widths, 4 layers; BERT at 128 tokens, ViT and ResNet-50 at 128 pixels;
# the Llama at issue 35's config (4 layers, hidden 256, GQA 8/4 heads, 128 tokens).
SIZES = {"vit": dict(layers=4, image_size=128), "bert": dict(layers=4, seq_len=128),
         "resnet50": dict(image_size=128),
         "llama": dict(layers=4, hidden=256, heads=8, kv_heads=4, mlp_dim=512, vocab_size=4096,
                       seq_len=128)}
# --quick: tiny widths, to prove each row runs, not to measure it.
QUICK = {"vit": dict(layers=1, image_size=32, hidden=64, heads=2, mlp_dim=128, num_classes=10),
         "bert": dict(layers=1, seq_len=16, hidden=64, heads=2, mlp_dim=128, vocab_size=512),
         "resnet50": dict(image_size=32, width=8, num_classes=10),
         "llama": dict(layers=1, hidden=64, heads=4, kv_heads=2, mlp_dim=128, vocab_size=256,
                       seq_len=16)}

# row -> (model, framework, reference, its default mode, its best mode, what it needs)
ROWS = {
    "vit-torch": ("vit", "torch", "hf", "eager", "compile", "transformers"),
    "bert-torch": ("bert", "torch", "hf", "eager", "compile", "transformers"),
    "resnet50-torch": ("resnet50", "torch", "torchvision", "eager", "compile", "torchvision"),
    "resnet50-tensorflow": ("resnet50", "tensorflow", "keras-app", "graph", "xla", "keras"),
    "vit-tensorflow": ("vit", "tensorflow", "keras-hub", "auto", "xla", "keras_hub"),
    "bert-tensorflow": ("bert", "tensorflow", "keras-hub", "auto", "xla", "keras_hub"),
    "vit-jax": ("vit", "jax", "keras-hub", "auto", "xla", "keras_hub"),
    "bert-jax": ("bert", "jax", "keras-hub", "auto", "xla", "keras_hub"),
    "llama-torch": ("llama", "torch", "hf", "eager", "compile", "transformers"),
    "llama-tensorflow": ("llama", "tensorflow", "keras-hub", "auto", "xla", "keras_hub"),
    "llama-jax": ("llama", "jax", "keras-hub", "auto", "xla", "keras_hub"),
    # keras.applications on the JAX backend: "auto" is jit there, as on the keras-hub JAX rows
    "resnet50-jax": ("resnet50", "jax", "keras-app", "auto", "xla", "keras"),
}
KERAS_BACKEND = {"tensorflow": "tensorflow", "jax": "jax"}
# framework=keras: fxtrack's Keras-3 path against the same references, one row per model and
# backend. Keras' default mode is "auto" on each; its other mode is jit_compile=True (XLA on
# TensorFlow and JAX, torch.compile of the step on torch, hence "compile").
KERAS_ROW_BACKEND: dict[str, str] = {}
for _backend, _best in (("tensorflow", "xla"), ("jax", "xla"), ("torch", "compile")):
    for _model in ("vit", "bert", "llama", "resnet50"):
        _app = _model == "resnet50"
        ROWS[f"{_model}-keras-{_backend}"] = (_model, "keras", "keras-app" if _app else "keras-hub",
                                              "auto", _best, "keras" if _app else "keras_hub")
        KERAS_ROW_BACKEND[f"{_model}-keras-{_backend}"] = _backend
# Both by default: issue 61 asks every family against its peer at fp32 and at bf16, so a bare
# run is that table; --precisions fp32 halves it (and --precision, its old name, still parses).
PRECISIONS = ("fp32", "bf16")
# the reference's mode -> compile(jit_compile=...): a plain graph (TF), Keras' own default, or
# compiled (XLA on TF and JAX, torch.compile on torch)
JIT_COMPILE = {"graph": False, "auto": "auto", "xla": True, "compile": True}


def keras_backend(row: str) -> str | None:
    """The Keras backend the row's processes run on (None: a torch row, no Keras)."""
    return KERAS_ROW_BACKEND.get(row) or KERAS_BACKEND.get(ROWS[row][1])


# ---------------------------------------------------------------------------------------- arms
# Each arm runs in its own process: built, warmed up, then "steps N" on stdin -> samples/s.

def job(arm: dict):
    """The JobSpec of the arm's framework, for fxtrack's backend and the worker's environment
    (threads, XLA flags), which every arm of the row gets alike."""
    import uuid

    from fxtrack import architectures
    from fxtrack.config.frameworks import packages
    from fxtrack.worker.protocol import JobSpec

    arch = architectures.resolve(arm["model"], **arm["dims"])
    mode = arm["mode"] if arm["kind"] == "fxtrack" else "auto"
    # framework=keras: the backend is a setting its environment hook reads (KERAS_BACKEND), for
    # the reference's process as for fxtrack's
    settings = {"keras_backend": arm["keras_backend"]} if arm["framework"] == "keras" else {}
    return arch, JobSpec(
        result_id=uuid.uuid4().hex, framework=arm["framework"],
        package=packages()[arm["framework"]], scenario="train",
        runner="fxtrack.scenarios.train.runner:run", arch=arch.to_json(), precision=arm["precision"],
        hardware="auto", devices=1, compile=mode != "false", compile_request=mode, seed=0,
        batch_size=arm["batch"], steps=1, warmup_steps=0, result_path="", progress=False,
        framework_settings=settings)


def fxtrack_step(arm: dict, arch, spec) -> tuple[Callable[[], Any], str]:
    from fxtrack.frameworks.declaration import declaration, import_path

    backend = import_path(declaration(spec.package).backend)(spec)
    kind = backend.device_kind()
    spec.compile, _ = declaration(spec.package).resolve_compile(kind, arch.family,
                                                                spec.compile_request,
                                                                dims=arch.dims,
                                                                precision=spec.precision)
    backend.build(arm["batch"])
    # Keras resolves its own "auto" (eager on torch, a plain graph on a TF CPU): what it chose
    compiled = getattr(backend, "compiled", spec.compile)
    return backend.train_step, backend.framework.compile_mode_tag(compiled,
                                                                   spec.framework_settings)


def torchvision_resnet50() -> Callable[..., Any]:
    """``torchvision.models.resnet50``: the package as installed, or, where its compiled op
    library does not load (the index's only torchvision for torch 2.13 is a CUDA build: "operator
    torchvision::nms does not exist" at import), its pure-Python model code without the package's
    ``__init__``. ResNet-50 calls none of those ops (detection's NMS, RoI pooling)."""
    import sys
    import types

    try:
        import torchvision
    except (RuntimeError, OSError):
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]  # the half-imported package
        package = types.ModuleType("torchvision")
        package.__path__ = list(importlib.util.find_spec("torchvision").submodule_search_locations)
        sys.modules["torchvision"] = package
        from torchvision.models.resnet import resnet50

        return resnet50
    return torchvision.models.resnet50


def torch_reference_model(arm: dict, arch) -> tuple[Any, Callable[[Any], Any]]:
    """The torch reference and its loss (model -> loss), fxtrack's batch on it."""
    import torch
    import torch.nn.functional as F

    from fxtrack.data import synthetic

    torch.manual_seed(0)
    data = synthetic.make_batch(arch, arm["batch"], 0)
    if arm["reference"] == "torchvision":
        model = torchvision_resnet50()(num_classes=arch.num_classes)
        model = model.to(memory_format=torch.channels_last)  # as fxtrack runs ResNet-50
        x = torch.from_numpy(data["images"]).permute(0, 3, 1, 2).contiguous(
            memory_format=torch.channels_last)
        y = torch.from_numpy(data["labels"]).long()
        forward = lambda m: F.cross_entropy(m(x), y)  # noqa: E731
    elif arch.family == "llama":
        import transformers as hf

        model = hf.LlamaForCausalLM(hf.LlamaConfig(
            vocab_size=arch.vocab_size, hidden_size=arch.hidden, num_hidden_layers=arch.layers,
            num_attention_heads=arch.heads, num_key_value_heads=arch.kv_heads,
            intermediate_size=arch.mlp_dim, max_position_embeddings=arch.seq_len,
            rope_theta=arch.rope_theta, rms_norm_eps=arch.norm_eps,
            tie_word_embeddings=arch.tied_embeddings, attn_implementation="sdpa"))
        ids = torch.from_numpy(data["input_ids"]).long()
        labels = torch.from_numpy(data["labels"]).long()
        # fxtrack's loss: the next token at every position (HF's own .loss shifts the labels)
        forward = lambda m: F.cross_entropy(  # noqa: E731
            m(input_ids=ids).logits.float().flatten(0, 1), labels.flatten())
    elif arch.family == "bert":
        import transformers as hf

        model = hf.BertForMaskedLM(hf.BertConfig(
            vocab_size=arch.vocab_size, hidden_size=arch.hidden, num_hidden_layers=arch.layers,
            num_attention_heads=arch.heads, intermediate_size=arch.mlp_dim,
            max_position_embeddings=arch.max_position, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, attn_implementation="sdpa"))
        ids = torch.from_numpy(data["input_ids"]).long()
        labels = torch.where(torch.from_numpy(data["mlm_weights"]) > 0,
                             torch.from_numpy(data["mlm_labels"]).long(), -100)
        forward = lambda m: m(input_ids=ids, labels=labels).loss  # noqa: E731
    else:
        import transformers as hf

        model = hf.ViTForImageClassification(hf.ViTConfig(
            hidden_size=arch.hidden, num_hidden_layers=arch.layers,
            num_attention_heads=arch.heads, intermediate_size=arch.mlp_dim,
            image_size=arch.image_size, patch_size=arch.patch, num_labels=arch.num_classes,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            attn_implementation="sdpa"))
        x = torch.from_numpy(data["images"]).permute(0, 3, 1, 2).contiguous()
        y = torch.from_numpy(data["labels"]).long()
        forward = lambda m: F.cross_entropy(m(pixel_values=x).logits, y)  # noqa: E731
    return model, forward


def torch_reference_step(arm: dict, arch, spec) -> tuple[Callable[[], Any], str]:
    import torch

    from fxtrack.frameworks.torch import train

    model, forward = torch_reference_model(arm, arch)
    model.train()
    opt = train.optimizer(model, arch, torch.device("cpu"), arm["batch"])  # fxtrack's, fused
    run = torch.compile(model) if arm["mode"] == "compile" else model

    # fxtrack's torch policy (train.forward_loss): forward and loss under autocast, backward
    # and the fp32 master weights' update outside it
    amp = train.AMP_DTYPES[arm["precision"]]

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=amp or torch.float32, enabled=amp is not None):
            loss = forward(run)
        loss.backward()
        opt.step()
        return loss.item()

    return step, arm["mode"]


def keras_reference_model(arm: dict, arch) -> tuple[Any, Any, Any, Any]:
    """The Keras reference (model, x, y, sample weights), built under the arm's dtype policy:
    at bf16 ``mixed_bfloat16`` (bf16 compute, fp32 variables), as fxtrack's Keras models are
    built (keras_train.POLICIES); set globally, as a user would, in this arm's own process."""
    import keras

    from fxtrack.data import synthetic

    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_bfloat16" if arm["precision"] == "bf16"
                                            else "float32")
    data = synthetic.make_batch(arch, arm["batch"], 0)
    if arm["reference"] == "keras-app":
        model = keras.applications.ResNet50(weights=None, input_shape=data["images"].shape[1:],
                                            classes=arch.num_classes, classifier_activation=None)
        x, y, weights = data["images"], data["labels"], None
    elif arch.family == "vit":
        import keras_hub

        backbone = keras_hub.models.ViTBackbone(
            image_shape=data["images"].shape[1:], patch_size=arch.patch, num_layers=arch.layers,
            num_heads=arch.heads, hidden_dim=arch.hidden, mlp_dim=arch.mlp_dim)
        images = keras.Input(data["images"].shape[1:])
        logits = keras.layers.Dense(arch.num_classes)(backbone(images)[:, 0])  # class token
        model = keras.Model(images, logits)
        x, y, weights = data["images"], data["labels"], None
    elif arch.family == "llama":
        import keras_hub
        import numpy as np

        backbone = keras_hub.models.LlamaBackbone(
            vocabulary_size=arch.vocab_size, num_layers=arch.layers, num_query_heads=arch.heads,
            num_key_value_heads=arch.kv_heads, hidden_dim=arch.hidden,
            intermediate_dim=arch.mlp_dim, rope_max_wavelength=arch.rope_theta,
            layer_norm_epsilon=arch.norm_eps, tie_word_embeddings=arch.tied_embeddings)
        inputs = {name: keras.Input((arch.seq_len,), dtype="int32", name=name)
                  for name in ("token_ids", "padding_mask")}
        # Llama3CausalLM's logits: the reversible token embedding (tied or its own matrix)
        logits = backbone.token_embedding(backbone(inputs), reverse=True)
        model = keras.Model(inputs, logits)
        ids = data["input_ids"]
        x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
        y, weights = data["labels"], None
    else:
        import keras_hub
        import numpy as np

        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=arch.vocab_size, num_layers=arch.layers, num_heads=arch.heads,
            hidden_dim=arch.hidden, intermediate_dim=arch.mlp_dim, dropout=0.0,
            max_sequence_length=arch.max_position)
        t = arch.seq_len
        inputs = {name: keras.Input((t,), dtype="int32", name=name)
                  for name in ("token_ids", "segment_ids", "padding_mask", "mask_positions")}
        # keras-hub's own masked-LM head, as BertMaskedLM builds it (dense + GELU + LayerNorm,
        # the tied token embedding, a bias), over every position: fxtrack's BERT (as Hugging
        # Face's) scores every token and weights the loss by the masked ones
        head = keras_hub.layers.MaskedLMHead(
            vocabulary_size=arch.vocab_size, token_embedding=backbone.token_embedding,
            intermediate_activation="gelu", layer_norm_epsilon=1e-12)
        features = {k: v for k, v in inputs.items() if k != "mask_positions"}
        logits = head(backbone(features)["sequence_output"], mask_positions=inputs["mask_positions"])
        model = keras.Model(inputs, logits)
        # the pooler (for classification) is not on the masked-LM path: no gradient, no update
        backbone.get_layer("pooled_dense").trainable = False
        ids = data["input_ids"]
        x = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids),
             "mask_positions": np.broadcast_to(np.arange(t, dtype=np.int32), ids.shape).copy()}
        y, weights = data["mlm_labels"], data["mlm_weights"]
    return model, x, y, weights


def keras_reference_step(arm: dict, arch, spec) -> tuple[Callable[[], Any], str]:
    import keras

    from fxtrack.frameworks.base import ADAMW, SGD, optimizer_choice

    model, x, y, weights = keras_reference_model(arm, arch)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    kind, lr = optimizer_choice(arch, arm["batch"])
    opt = (keras.optimizers.SGD(lr, momentum=SGD["momentum"], weight_decay=SGD["weight_decay"])
           if kind == "sgd" else
           keras.optimizers.AdamW(lr, weight_decay=ADAMW["weight_decay"], beta_1=ADAMW["b1"],
                                  beta_2=ADAMW["b2"], epsilon=ADAMW["eps"]))
    model.compile(optimizer=opt, loss=loss, jit_compile=JIT_COMPILE[arm["mode"]])
    # on the device once, as fxtrack's own batch is: no host copy inside the timed steps
    tensor = keras.ops.convert_to_tensor
    x = {k: tensor(v) for k, v in x.items()} if isinstance(x, dict) else tensor(x)
    y, weights = tensor(y), None if weights is None else tensor(weights)

    def step():
        return model.train_on_batch(x, y, sample_weight=weights)  # a Python float: synced

    return step, f"{arm['mode']} (jit_compile={model.jit_compile})"


def serve(arm: dict) -> None:
    """One arm's process: build, warm up, say ready, then time ``steps N`` requests."""
    from fxtrack.worker.__main__ import prepare_environment

    arch, spec = job(arm)
    prepare_environment(spec)  # before the framework's import: threads, XLA flags, device
    if arm["kind"] == "fxtrack":
        step, mode = fxtrack_step(arm, arch, spec)
    elif arm["framework"] == "torch":
        step, mode = torch_reference_step(arm, arch, spec)
    else:
        step, mode = keras_reference_step(arm, arch, spec)
    for _ in range(arm["warmup"]):
        step()
    print(json.dumps({"ready": True, "mode": mode}), flush=True)
    for line in sys.stdin:
        steps = int(line.split()[1])
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        print(json.dumps({"samples_per_s": arm["batch"] * steps / (time.perf_counter() - t0)}),
              flush=True)


# -------------------------------------------------------------------------------------- parent

class Arm:
    """A started arm process."""

    def __init__(self, label: str, spec: dict, env: dict[str, str]) -> None:
        self.label, self.samples = label, []
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     text=True)
        self.mode = self._answer()["mode"]

    def _answer(self) -> dict:
        for line in self.proc.stdout:  # frameworks may print to stdout as they start
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"{self.label}: the arm's process ended (status {self.proc.wait()})")

    def run(self, steps: int) -> float:
        self.proc.stdin.write(f"steps {steps}\n")
        self.proc.stdin.flush()
        self.samples.append(self._answer()["samples_per_s"])
        return self.samples[-1]

    def close(self) -> None:
        if self.proc.stdin:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:  # the arm's process already ended (a failed arm)
                pass
        self.proc.wait(timeout=60)


def missing(row: str) -> str | None:
    module = ROWS[row][5]
    return None if importlib.util.find_spec(module) else f"{module.replace('_', '-')} not installed"


def arms_of(row: str, modes: str, precision: str,
            control: bool = False) -> list[tuple[str, dict]]:
    """(label, arm spec) for the row's arms at ``precision``: the reference's best first (the
    ratios' base). ``control``: the same reference at its best again, in a process of its own,
    last: its ratio is what the bench reads between two processes of one model (its noise)."""
    model, framework, reference, default, best, _ = ROWS[row]
    arms = [(f"{reference} {best}", dict(kind="reference", reference=reference, mode=best)),
            ("fxtrack auto", dict(kind="fxtrack", mode="auto"))]
    if modes == "all":
        arms += [("fxtrack compile=true", dict(kind="fxtrack", mode="true")),
                 (f"{reference} {default}", dict(kind="reference", reference=reference,
                                                 mode=default))]
    if control:
        arms.append((f"{reference} {best} (control)", dict(arms[0][1])))
    return [(label, dict(spec, model=model, framework=framework, precision=precision,
                         keras_backend=keras_backend(row))) for label, spec in arms]


def select(only: str) -> list[str]:
    """``--only``'s rows, in the order given: names or shell patterns (``*-keras-*``)."""
    rows: list[str] = []
    for item in only.split(","):
        hits = [row for row in ROWS if fnmatch.fnmatchcase(row, item)]
        if not hits:
            raise ValueError(f"no row {item!r}; rows: {', '.join(ROWS)}")
        rows += [row for row in hits if row not in rows]
    return rows


def measure_row(row: str, precision: str, args: argparse.Namespace) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                                    os.environ.get("PYTHONPATH")])))
    if keras_backend(row):
        env["KERAS_BACKEND"] = keras_backend(row)
    dims = (QUICK if args.quick else SIZES)[ROWS[row][0]]
    batch = args.batch or (2 if args.quick else BATCHES.get(ROWS[row][0], BATCH))
    arms: list[Arm] = []
    label = ""
    try:
        for label, spec in arms_of(row, args.modes, precision, args.control):  # one at a time
            arms.append(Arm(label, dict(spec, dims=dims, batch=batch, warmup=args.warmup), env))
        for r in range(args.rounds):
            for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
                label = arm.label
                arm.run(args.steps)
            print(f"{row} {precision} round {r + 1}: " + ", ".join(
                f"{a.label} {a.samples[-1]:.2f}" for a in arms) + " samples/s",
                  file=sys.stderr, flush=True)
    except (RuntimeError, BrokenPipeError) as e:
        # one arm that cannot run (its traceback is above, on stderr) costs its row, not the
        # hours of rows after it
        return {"row": row, "precision": precision, "skipped": f"{label} failed: {e}"[:200]}
    finally:
        for arm in arms:
            arm.close()
    return {"row": row, "precision": precision, "batch": batch,
            "arms": [{"label": a.label, "mode": a.mode, "samples_per_s": a.samples} for a in arms]}


def table(rows: list[dict]) -> list[str]:
    from fxtrack import stats

    # the mode column fits framework=keras' tags (keras-tensorflow:tf.function)
    out = [f"{'row':<25} {'prec':<4} {'arm':<22} {'mode that ran':<28} {'samples/s [95%]':<28} "
           "arm / reference's best [95%]"]
    for row in rows:
        head = f"{row['row']:<25} {row.get('precision', ''):<4}"
        if "skipped" in row:
            out.append(f"{head} {row['skipped']}")
            continue
        base = row["arms"][0]["samples_per_s"]
        for arm in row["arms"]:
            xs = arm["samples_per_s"]
            ci = stats.log_t_interval(xs)
            rate = f"{stats.median(xs):.2f} [{ci.low:.2f}, {ci.high:.2f}]"
            logs = [math.log(a / b) for a, b in zip(xs, base)]
            rci = stats.t_interval(logs)
            ratio = f"{stats.median([a / b for a, b in zip(xs, base)]):.3f} " \
                    f"[{math.exp(rci.low):.3f}, {math.exp(rci.high):.3f}]"
            out.append(f"{head} {arm['label']:<22} {arm['mode'][:28]:<28} {rate:<28} {ratio}")
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--steps", type=int, default=STEPS, help="timed steps per arm per round")
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--batch", type=int, default=None,
                        help=f"default: {BATCH}, the Llama {BATCHES['llama']}")
    parser.add_argument("--precisions", "--precision", default=",".join(PRECISIONS),
                        help="comma-separated, each row at each (default: fp32,bf16)")
    parser.add_argument("--only", default=",".join(ROWS), help="comma-separated rows or "
                        "patterns (*-keras-*): " + ", ".join(ROWS))
    parser.add_argument("--modes", choices=("best", "all"), default="best",
                        help="best: fxtrack's default vs the reference's best; all: also "
                             "fxtrack compile=true and the reference's default")
    parser.add_argument("--control", action="store_true",
                        help="add the reference's best again in a process of its own: its "
                             "ratio is the bench's own noise between two processes")
    parser.add_argument("--image-size", type=int, default=None,
                        help="ViT's and ResNet-50's pixels (default 128; issue 26's table: 64)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny widths, 2 rounds of 2 steps, batch 2: proves every row runs")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.precisions = args.precisions.split(",")
    if not set(args.precisions) <= set(PRECISIONS):
        parser.error(f"--precisions: each of {', '.join(PRECISIONS)}")
    if not args.serve:
        try:
            args.rows = select(args.only)
        except ValueError as e:
            parser.error(str(e))
    return args


def main() -> None:
    args = parse()
    if args.serve:
        serve(json.loads(args.serve))
        return
    if args.image_size:
        for model in ("vit", "resnet50"):
            SIZES[model]["image_size"] = args.image_size
    if args.quick:
        args.rounds, args.steps, args.warmup = 2, 2, 1
    sys.path.insert(0, str(ROOT))
    rows = []
    for row in args.rows:
        why = missing(row)
        rows += [{"row": row, "skipped": why}] if why else [
            measure_row(row, precision, args) for precision in args.precisions]
    sizes = "tiny widths (--quick)" if args.quick else json.dumps(SIZES)
    batches = sorted({str(r["batch"]) for r in rows if "batch" in r})
    print(f"\n{sizes}, batch {'/'.join(batches)}, {args.steps} timed steps per arm per round, "
          f"{args.rounds} rotated rounds, {'/'.join(args.precisions)}, {os.cpu_count()} cores; "
          "ratio = arm / the reference's best, paired per round")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
