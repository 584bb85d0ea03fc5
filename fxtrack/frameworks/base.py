"""The small contract between a scenario and a framework (no framework imported here): what
every framework must do. Anything optional is a capability the framework declares
(``fxtrack.frameworks.declaration``) and a scenario asks for by name (``Backend.capability``)."""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, ClassVar, Optional

from fxtrack import families
from fxtrack.architectures import Arch
from fxtrack.families.spec import ADAMW, SGD, sgd_lr  # noqa: F401  (the families' optimisers)
from fxtrack.families.vision import image_hw, patch_grid, patch_hw  # noqa: F401  (the ViT's input)
from fxtrack.frameworks.declaration import Framework, declaration
from fxtrack.worker.protocol import JobSpec

VIT_LAYER_NORM_EPS, BERT_LAYER_NORM_EPS = 1e-6, 1e-12  # timm's ViT, Hugging Face's BERT
BATCH_NORM_EPS, BATCH_NORM_MOMENTUM = 1e-5, 0.1  # torch convention: new = 0.9 old + 0.1 batch
# The ``fxtrack.matmul_form`` tag of a bf16 run whose dots take the form XLA:CPU runs on its bf16
# kernels (frameworks/xla_bf16.py, frameworks/tensorflow/matmul.py).
BF16_KERNEL_FORM = ("bf16 operands, float32 accumulation, canonical layouts (the one form XLA:CPU "
                    "runs bf16 dots on its bf16 kernels in)")


@dataclasses.dataclass(frozen=True)
class PeakMemory:
    """A framework's own peak device memory readings, named by what they count: each allocator
    counts something else (torch's tensors, without its cache; JAX's and TensorFlow's buffers),
    so a comparison across frameworks says which kind it compares."""

    kind: str  # what ``bytes`` counts, e.g. "torch.max_memory_allocated"
    bytes: int
    reserved_kind: Optional[str] = None  # the allocator's pool peak, where it keeps one
    reserved_bytes: Optional[int] = None

    @staticmethod
    def from_jax_stats(stats: Optional[dict]) -> Optional["PeakMemory"]:
        """A JAX device's ``memory_stats()`` (JAX itself, or Keras on its JAX backend): buffers
        in use at their peak and, where the allocator reports it, the pool it grew for them;
        None where the device keeps no statistics (CPU)."""
        stats = stats or {}
        if stats.get("peak_bytes_in_use") is None:
            return None
        pool = stats.get("peak_pool_bytes")
        return PeakMemory("jax.peak_bytes_in_use", int(stats["peak_bytes_in_use"]),
                          None if pool is None else "jax.peak_pool_bytes",
                          None if pool is None else int(pool))

    @staticmethod
    def fullest(readings: list[Optional["PeakMemory"]]) -> Optional["PeakMemory"]:
        """Of one process's devices, the fullest (None: a device without a counter)."""
        if not readings or None in readings:
            return None
        return max(readings, key=lambda r: r.bytes)  # type: ignore[union-attr]


def optimizer_choice(arch: Arch, global_batch: int) -> tuple[str, float]:
    """(``sgd`` | ``adamw``, learning rate), the same in every framework: SGD at the scaled rate
    for ResNet-50, AdamW for the transformers, and a user's model (model=custom) its own
    ``model.optimizer`` and ``model.lr``: its family's choice (``Family.optimizer``)."""
    return families.of(arch).optimizer(arch, global_batch)


def attention_tokens(arch: Arch) -> int:
    """Sequence length T the attention layers see (``Family.attention_tokens``): BERT's
    tokens, or ViT's patches + class."""
    tokens = families.of(arch).attention_tokens
    if tokens is None:
        raise ValueError(f"model family {arch.family!r} has no attention")
    return tokens(arch)


@dataclasses.dataclass(frozen=True)
class Builder:
    """One framework's builder of one model family, the value of its models module's
    ``BUILDERS[family]``, with the choices the family takes in that framework: a backend asks
    this record, never the family's name (torchtitan's TrainSpec, one per framework)."""

    build: Callable[..., Any]  # (arch, ...) -> the framework's model
    # the attention its layers run, for the run's ``attention`` tag: "full" (bidirectional,
    # a KV head per query head) or "causal_gqa" (a decoder's causal, grouped-query); None: none
    attention: Optional[str] = None
    # convolutions: torch runs them channels-last (NHWC kernels), a run tags its conv_form
    convolutional: bool = False
    # its loss is the mean over the positions its batch weights (BERT's masked LM: the
    # mlm_weights); False: over every sample or position. Read where one loss object is chosen
    # up front (Keras' compile); the other frameworks' losses follow the batch's keys
    weighted_loss: bool = False


class Backend(abc.ABC):
    """One framework, set up for one job. The worker calls, in order: ``device_kind``,
    ``build``, then ``train_step`` (or a capability's step) many times."""

    name: ClassVar[str]
    # model=custom with model.kind=lm: the tokens per sample of its inputs (set when built)
    seq_len: Optional[int] = None

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.arch = Arch.from_json(spec.arch)

    @abc.abstractmethod
    def version(self) -> str:
        """The framework's version string."""

    @abc.abstractmethod
    def device_kind(self) -> str:
        """``"gpu"`` or ``"cpu"``: what ``spec.hardware`` resolved to; raises if ``gpu`` is
        asked for and the framework sees none."""

    def device_tags(self) -> dict[str, str]:
        """Facts about the device this framework runs on (name, CUDA/cuDNN versions, ...)."""
        return {}

    @abc.abstractmethod
    def build(self, batch_size: int) -> None:
        """Build model and optimiser from ``spec.seed`` and put one synthetic batch
        (``fxtrack.data.synthetic.make_batch``) on the device."""

    @abc.abstractmethod
    def param_count(self) -> int:
        """Trainable parameters of the built model."""

    @abc.abstractmethod
    def train_step(self) -> Any:
        """One optimiser step on the resident batch; returns only when the device has finished,
        with a handle to the loss that ``loss_value`` reads later (outside the timed window)."""

    @abc.abstractmethod
    def loss_value(self, handle: Any) -> float:
        """The loss behind a handle from ``train_step``, as a Python float."""

    def peak_memory(self) -> Optional[PeakMemory]:
        """The framework's own peak device memory on this process's fullest device, or None
        where it has no such counter (CPU)."""
        return None

    def state_bytes_per_device(self) -> Optional[int]:
        """Bytes of persistent training state (parameters, buffers / batch statistics, optimiser
        state) on the fullest device this process drives, counted from the arrays each device
        really holds (its shards under parallel=fsdp); None where not counted. Gradients are
        left out: JAX's live only inside the compiled step."""
        return None

    def reduce_max(self, value: float) -> float:
        """The largest ``value`` over every process of a multi-process run (memory peaks);
        called by every process at the same point."""
        return value

    def visible_devices(self) -> list[str]:
        """Every device this framework can use here, e.g. ``["cpu", "cuda:0 NVIDIA H200"]``."""
        return []

    @property
    def framework(self) -> Framework:
        """What this framework declares (its package's ``FRAMEWORK``)."""
        return declaration(self.spec.package)

    def capability(self, name: str) -> Any:
        """The framework's module for the optional capability ``name`` (a key of
        ``fxtrack.frameworks.declaration.CAPABILITIES``), checked against the capability's
        protocol (``fxtrack.frameworks.capabilities``); its functions take this backend first.
        Raises ``NotSupported``, with the declared reason, where the framework has none."""
        return self.framework.capability(name)
