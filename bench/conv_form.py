"""fxtrack's JAX ResNet-50 training gradient with its 1x1 convolutions as matmuls (the
``fxtrack.conv_form`` on a CPU, frameworks/xla_bf16.py) against the same model with XLA's own
convolutions, side by side in one process: both forms compiled first, then timed alternately
round by round. Prints each form's median ms over the rounds, and the ratio; with ``--layers``,
first the TFLOP/s of each distinct 1x1 convolution of ResNet-50 (forward and both gradients)
in each form, of its 3x3 convolutions against one matmul over their gathered patches (why they
stay convolutions), and of a square matmul of the same precision for scale.

    python bench/conv_form.py [--precisions fp32,bf16] [--rounds 7] [--batch 8] [--image 224]
                              [--layers]
"""

from __future__ import annotations

import argparse
import statistics
import time

FORMS = ("XLA's convolutions", "1x1 as matmuls")
# ResNet-50's distinct 1x1 convolutions at 224 px: (input map side, in, out, stride)
POINTWISE = ((56, 64, 64, 1), (56, 64, 256, 1), (56, 256, 64, 1), (56, 256, 128, 1),
             (56, 256, 512, 2), (28, 128, 512, 1), (28, 512, 128, 1), (28, 512, 256, 1),
             (28, 512, 1024, 2), (14, 256, 1024, 1), (14, 1024, 256, 1), (14, 1024, 512, 1),
             (14, 1024, 2048, 2), (7, 512, 2048, 1), (7, 2048, 512, 1))


def median_ms(run, rounds: int) -> float:
    run()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def layer_rates(precision: str, batch: int, rounds: int) -> None:
    """Each 1x1 convolution's forward + input and weight gradients, in each form."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    from fxtrack.frameworks import xla_bf16
    from fxtrack.frameworks.jax.train import COMPUTE_DTYPES

    dtype = COMPUTE_DTYPES[precision]
    n = 2048
    a = jnp.ones((n, n), dtype)
    square = median_ms(lambda: jax.block_until_ready(xla_bf16.PROBE_PRODUCT(a, a)), rounds)
    print(f"{precision}  square {n} matmul: {2 * n**3 / square / 1e9:.3f} TFLOP/s")
    convolve = {
        FORMS[0]: lambda x, w, s: lax.conv_general_dilated(
            x, w, (s, s), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")),
        FORMS[1]: lambda x, w, s: xla_bf16.pointwise_conv(x, w, (s, s))}
    for side, c_in, c_out, stride in POINTWISE:
        x = jax.random.normal(jax.random.key(0), (batch, side, side, c_in), dtype)
        w = jax.random.normal(jax.random.key(1), (1, 1, c_in, c_out), dtype)
        flops = 3 * 2 * batch * (side // stride) ** 2 * c_in * c_out
        rates = []
        for form in FORMS:
            grad = jax.jit(jax.grad(lambda x, w, f=convolve[form]: jnp.sum(
                f(x, w, stride).astype(jnp.float32) ** 2), argnums=(0, 1)))
            ms = median_ms(lambda: jax.block_until_ready(grad(x, w)), rounds)
            rates.append(flops / ms / 1e9)
        print(f"{precision}  {side:>3}x{side:<3} {c_in:>4}->{c_out:<4} stride {stride}: "
              f"{rates[0]:.3f} -> {rates[1]:.3f} TFLOP/s ({rates[1] / rates[0]:.1f}x)")
    # The 3x3s, which stay convolutions: one matmul over the gathered 3x3 patches (im2col)
    def patches(x, w):
        side = x.shape[1]
        padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
        cols = jnp.concatenate([padded[:, i:i + side, j:j + side, :]
                                for i in range(3) for j in range(3)], axis=-1)
        return xla_bf16.matmul(cols, w.reshape(-1, w.shape[-1]))

    same = lambda x, w: lax.conv_general_dilated(  # noqa: E731
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    for side, c in ((56, 64), (28, 128), (14, 256), (7, 512)):
        x = jax.random.normal(jax.random.key(0), (batch, side, side, c), dtype)
        w = jax.random.normal(jax.random.key(1), (3, 3, c, c), dtype)
        flops = 3 * 2 * batch * side * side * c * c * 9
        rates = []
        for f in (same, patches):
            grad = jax.jit(jax.grad(lambda x, w, f=f: jnp.sum(f(x, w).astype(jnp.float32) ** 2),
                                    argnums=(0, 1)))
            rates.append(flops / median_ms(lambda: jax.block_until_ready(grad(x, w)), rounds) / 1e9)
        print(f"{precision}  3x3 {side:>3}x{side:<3} {c:>4}->{c:<4}: convolution {rates[0]:.3f}, "
              f"im2col matmul {rates[1]:.3f} TFLOP/s ({rates[1] / rates[0]:.1f}x)")


def compiled_steps(precision: str, batch: int, image: int) -> dict:
    """Each form's jitted loss gradient of the same model and batch, compiled."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from fxtrack import architectures
    from fxtrack.frameworks import xla_bf16
    from fxtrack.frameworks.jax import models
    from fxtrack.frameworks.jax.train import COMPUTE_DTYPES

    arch = architectures.resolve("resnet50", "full", image_size=image)
    dtype = COMPUTE_DTYPES[precision]
    model = models.build(arch, dtype, nnx.Rngs(0))
    model.train()
    graph, state = nnx.split(model)
    x = jax.random.normal(jax.random.key(1), (batch, image, image, 3))
    y = jax.random.randint(jax.random.key(2), (batch,), 0, arch.num_classes)

    def loss(state, x, y):
        logits = nnx.merge(graph, state)(x).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    steps = {}
    for form in FORMS:  # the flag is read while tracing: each form compiles its own graph
        xla_bf16.CONVS_AS_MATMULS = form == FORMS[1]
        step = jax.jit(jax.grad(loss)).lower(state, x, y).compile()
        jax.block_until_ready(step(state, x, y))
        steps[form] = lambda step=step: jax.block_until_ready(step(state, x, y))
    xla_bf16.CONVS_AS_MATMULS = True
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=8)  # the ResNet-50 default
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--layers", action="store_true",
                        help="first each 1x1 convolution's rate in each form")
    args = parser.parse_args()
    for precision in args.precisions.split(","):
        if args.layers:
            layer_rates(precision, args.batch, args.rounds)
        steps = compiled_steps(precision, args.batch, args.image)
        times = {form: [] for form in FORMS}
        for _ in range(args.rounds):
            for form in FORMS:
                start = time.perf_counter()
                steps[form]()
                times[form].append((time.perf_counter() - start) * 1e3)
        median = {form: statistics.median(ms) for form, ms in times.items()}
        for form in FORMS:
            print(f"{precision}  {form:<20} {median[form]:8.1f} ms  "
                  f"(range {min(times[form]):.1f}-{max(times[form]):.1f}, {args.rounds} rounds)")
        print(f"{precision}  speed-up of 1x1 as matmuls: {median[FORMS[0]] / median[FORMS[1]]:.2f}x")


if __name__ == "__main__":
    main()
