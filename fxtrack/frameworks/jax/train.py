"""Optimiser, loss and the training step for JAX: a pure function of (state, batch), jitted with
the state donated, mixed precision by compute dtype, dynamic loss scaling for fp16.

The step follows Flax's functional-API pattern (``nnx.split`` once, ``nnx.merge`` inside the
traced function): the jitted function sees only arrays, so each call costs one dispatch.
``compile=False`` runs the same function under ``jax.disable_jit``: every primitive is
dispatched on its own, op by op, the JAX counterpart of eager PyTorch.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from fxtrack.architectures import Arch
from fxtrack.frameworks.base import ADAMW, SGD, optimizer_choice
from fxtrack.frameworks.jax import models

# tf32 computes in float32 like fp32 (TF32 matmuls are a config setting: devices.configure).
COMPUTE_DTYPES = {"fp32": jnp.float32, "tf32": jnp.float32, "bf16": jnp.bfloat16,
                  "fp16": jnp.float16}

# torch.amp.GradScaler's defaults, so that fp16 runs skip and grow steps alike.
INIT_SCALE, GROWTH_INTERVAL = 2.0**16, 2000


class LossScale(NamedTuple):
    """Dynamic loss scale for fp16: halve on overflow, double after GROWTH_INTERVAL good steps."""

    scale: jax.Array  # () float32
    good_steps: jax.Array  # () int32, finite steps since the last change

    def update(self, finite: jax.Array) -> "LossScale":
        """The next scale after a step whose gradients were (not) all finite."""
        grow = finite & (self.good_steps + 1 >= GROWTH_INTERVAL)
        scale = jnp.where(finite, jnp.where(grow, self.scale * 2, self.scale), self.scale / 2)
        good = jnp.where(finite & ~grow, self.good_steps + 1, 0)
        return LossScale(scale, good.astype(jnp.int32))


class TrainState(NamedTuple):
    """Everything a step reads and rewrites; a pytree of arrays, donated to the jitted step."""

    params: nnx.State  # trainable parameters, float32
    batch_stats: nnx.State  # every non-parameter variable: BatchNorm statistics, RNG state
    opt_state: optax.OptState
    loss_scale: Optional[LossScale]  # fp16 only


def optimizer(arch: Arch, global_batch: int = 256) -> optax.GradientTransformation:
    """SGD+momentum with coupled L2 weight decay (as torch.optim.SGD) for ResNet-50, AdamW
    (decoupled, as torch.optim.AdamW) for transformers; both on every parameter, like torch."""
    kind, lr = optimizer_choice(arch, global_batch)
    if kind == "sgd":
        return optax.chain(optax.add_decayed_weights(SGD["weight_decay"]),
                           optax.sgd(lr, momentum=SGD["momentum"]))
    return optax.adamw(lr, b1=ADAMW["b1"], b2=ADAMW["b2"], eps=ADAMW["eps"],
                       weight_decay=ADAMW["weight_decay"])


def loss_fn(logits: jax.Array, batch: dict[str, jax.Array]) -> jax.Array:
    """Cross-entropy in float32: mean over images or over every Llama position (next-token
    labels), or weighted over the masked BERT positions."""
    logits = logits.astype(jnp.float32)  # (B, classes) or (B, T, vocab)
    if "labels" in batch:
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["mlm_labels"])  # (B, T)
    w = batch["mlm_weights"]
    return (ce * w).sum() / w.sum()


def model_inputs(batch: dict[str, jax.Array]) -> jax.Array:
    """What the model reads: images (B, H, W, 3) or token ids (B, T)."""
    return batch["images"] if "images" in batch else batch["input_ids"]


def init_state(model: nnx.Module, tx: optax.GradientTransformation,
               precision: str) -> tuple[nnx.GraphDef, TrainState]:
    """Split a (training-mode) model into its static graph and the arrays a step updates: the
    parameters, and every other variable (BatchNorm's statistics; a user's model may also
    carry Dropout's RNG keys and counts), which the step carries as ``batch_stats``."""
    graphdef, params, batch_stats = nnx.split(model, nnx.Param, ...)
    scale = None
    if precision == "fp16":
        scale = LossScale(jnp.asarray(INIT_SCALE, jnp.float32), jnp.asarray(0, jnp.int32))
    return graphdef, TrainState(params, batch_stats, tx.init(params), scale)


def model_loss(model: nnx.Module, batch: dict[str, jax.Array]) -> jax.Array:
    """fxtrack's own models: logits of the batch's inputs, and their cross-entropy."""
    return loss_fn(model(model_inputs(batch)), batch)


def grads_and_loss(graphdef: nnx.GraphDef, state: TrainState, batch: dict[str, jax.Array],
                   loss_of: Callable[[nnx.Module, Any], jax.Array] = model_loss):
    """(grads, loss, new batch_stats) of one training-mode forward + backward; with fp16 the
    loss is scaled before and the gradients unscaled after differentiation."""
    scale = state.loss_scale.scale if state.loss_scale is not None else None

    def scaled_loss(params: nnx.State):
        # copy=True: fresh Variables at this trace level, so BatchNorm may update its statistics
        model = nnx.merge(graphdef, params, state.batch_stats, copy=True)
        loss = loss_of(model, batch)
        # running statistics (and RNG counts) after this forward
        stats = nnx.state(model, nnx.Not(nnx.Param))
        return (loss if scale is None else loss * scale), (loss, stats)

    grads, (loss, stats) = jax.grad(scaled_loss, has_aux=True)(state.params)
    if scale is not None:
        grads = jax.tree.map(lambda g: g / scale, grads)
    return grads, loss, stats


def train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, state: TrainState,
               batch: dict[str, jax.Array],
               loss_of: Callable[[nnx.Module, Any], jax.Array] = model_loss
               ) -> tuple[TrainState, jax.Array]:
    """One optimiser step, a pure function: returns the next state and the (unscaled) loss."""
    grads, loss, stats = grads_and_loss(graphdef, state, batch, loss_of)
    with jax.named_scope("optimizer"):  # a name only: the profile capability's split reads it
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
    if state.loss_scale is None:
        return TrainState(params, stats, opt_state, None), loss
    # fp16: skip the update when a gradient overflowed (BatchNorm statistics still advance, as
    # under torch's GradScaler), and adapt the scale.
    finite = jnp.all(jnp.asarray([jnp.isfinite(g).all() for g in jax.tree.leaves(grads)]))

    def keep(new: Any, old: Any) -> Any:  # new where the step is finite, else old
        return jax.tree.map(lambda x, y: jnp.where(finite, x, y), new, old)

    return TrainState(keep(params, state.params), stats, keep(opt_state, state.opt_state),
                      state.loss_scale.update(finite)), loss


def donates(device_kind: str, request: str = "auto") -> tuple[bool, str]:
    """Whether the jitted training step donates its state (``donate_argnums``: the new
    parameters and optimiser state are written into the old buffers), and why (the
    ``fxtrack.jax_donation`` tag), for ``framework.donate=request``. ``auto`` donates on every
    device: the state is not held twice, JAX's documented idiom for a training step (on XLA:CPU
    it measured 2-5% slower, docs/measurements.md: ``false`` turns it off)."""
    if request == "false":
        return False, "off (framework.donate=false)"
    if request == "true":
        return True, f"state donated on {device_kind} (framework.donate=true)"
    return True, f"state donated on {device_kind}"


def make_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, jit: bool = True,
              replicated: Optional[Any] = None, sharded: Optional[Any] = None,
              donate: bool = True, loss_of: Callable[[nnx.Module, Any], jax.Array] = model_loss
              ) -> Callable[[TrainState, dict], tuple[TrainState, jax.Array]]:
    """``train_step`` bound to a model and optimiser: jitted, with ``state`` donated (its
    buffers are reused in place) if ``donate`` (``donates``), or run op by op
    under ``jax.disable_jit`` if ``jit`` is False.

    ``replicated`` / ``sharded`` (``jax.sharding`` objects, see ``parallel``) place the state and
    the batch: with the batch split over devices, XLA partitions the step and all-reduces the
    gradients itself."""
    step = functools.partial(train_step, graphdef, tx, loss_of=loss_of)
    if jit:
        donated = 0 if donate else ()
        if replicated is None:
            return jax.jit(step, donate_argnums=donated)
        return jax.jit(step, donate_argnums=donated, in_shardings=(replicated, sharded),
                       out_shardings=(replicated, replicated))
    return _eager(step)


def eval_graphdef(graphdef: nnx.GraphDef, state: TrainState) -> nnx.GraphDef:
    """The graph of the model in inference mode (BatchNorm on its running statistics)."""
    model = nnx.merge(graphdef, state.params, state.batch_stats)  # no copy: wraps the arrays
    model.eval()
    return nnx.graphdef(model)


def forward(graphdef: nnx.GraphDef, params: nnx.State, batch_stats: nnx.State,
            x: jax.Array) -> jax.Array:
    """Inference: (B, H, W, 3) images or (B, T) ids -> logits, a pure function of the arrays."""
    return nnx.merge(graphdef, params, batch_stats)(x)


def make_forward(graphdef: nnx.GraphDef, jit: bool = True, replicated: Optional[Any] = None,
                 sharded: Optional[Any] = None) -> Callable[..., jax.Array]:
    """``forward`` bound to an eval-mode graph: jitted (weights replicated, inputs sharded as
    in training) or op by op."""
    fwd = functools.partial(forward, graphdef)
    if not jit:
        return _eager(fwd)
    if replicated is None:
        return jax.jit(fwd)
    return jax.jit(fwd, in_shardings=(replicated, replicated, sharded), out_shardings=sharded)


def _eager(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` dispatched primitive by primitive (``compile=False``)."""

    def eager(*args: Any) -> Any:
        with jax.disable_jit():
            return fn(*args)

    return eager


def training_flops_per_sample(arch: Arch, batch_size: int = 8, precision: str = "fp32") -> float:
    """XLA's own count (``cost_analysis()['flops']``) of one compiled training step (forward,
    backward and optimiser update), per sample. Nothing is materialised: the step is lowered
    for abstract shapes. The optimiser's O(params) work is amortised over ``batch_size``."""
    from fxtrack.data.synthetic import make_batch

    tx, dtype = optimizer(arch), COMPUTE_DTYPES[precision]
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: models.build(arch, dtype)))
    state = jax.eval_shape(lambda: init_state(models.build(arch, dtype), tx, precision)[1])
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype)
             for k, v in make_batch(arch, batch_size, 0).items()}
    step = jax.jit(functools.partial(train_step, graphdef, tx), donate_argnums=0)
    compiled = step.lower(state, batch).compile()
    cost: Any = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older JAX: one dict per computation
        cost = cost[0]
    return float(cost["flops"]) / batch_size
