"""Which bf16 dot forms XLA:CPU runs on its bf16 kernels: one dense layer's three products
(forward x w, input gradient g w^T, weight gradient x^T g) at a transformer's sizes, timed in
each form in JAX and in TensorFlow under XLA, side by side in one process per framework, the
forms alternated round to round. Prints each form's median ms and its ratio to XLA's own bf16
dot (bf16 result). The rule it backs: fxtrack's models emit every dot of a bf16 step as bf16
operands with a float32 result and the left operand contracting its last axis
(frameworks/xla_bf16.py, frameworks/tensorflow/matmul.py).

    python bench/bf16_dots.py [--frameworks jax,tensorflow] [--rounds 7] [--m 1024 --k 768 --n 3072]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

# form -> what it computes, and how (x (M, K), w (K, N), g (M, N); bf16 operands)
FORMS = {
    "bf16 result": "x w, XLA's own bf16 dot (what nnx.Linear and Keras' Dense ask for)",
    "f32 result": "x w, bf16 operands, float32 result (lhs contracts its last axis)",
    "dx, f32 result": "g w^T, bf16 operands, float32 result (lhs contracts its last axis)",
    "dw, lhs contracts axis 0": "x^T g as XLA's transpose rule writes it, float32 result",
    "dw, x^T written out": "x^T g with x^T materialised first (fxtrack's form), float32 result",
}


def jax_forms(m: int, k: int, n: int) -> dict:
    import jax
    import jax.numpy as jnp
    from jax import lax

    from fxtrack.frameworks import xla_bf16 as matmul

    key = jax.random.key(0)
    x, w, g = (jax.random.normal(key, s).astype(jnp.bfloat16) for s in ((m, k), (k, n), (m, n)))

    def dot(a, b, lc, rc, f32=True):
        return lax.dot_general(a, b, (((lc,), (rc,)), ((), ())),
                               preferred_element_type=jnp.float32 if f32 else None)

    # the operands are arguments: closed-over arrays would be constants XLA folds away
    fns = {"bf16 result": (lambda x, w, g: dot(x, w, 1, 0, f32=False)),
           "f32 result": (lambda x, w, g: dot(x, w, 1, 0)),
           "dx, f32 result": (lambda x, w, g: dot(g, w, 1, 1)),
           "dw, lhs contracts axis 0": (lambda x, w, g: dot(x, g, 0, 0)),
           "dw, x^T written out": (lambda x, w, g: dot(matmul._transposed(x), g, 1, 0))}
    jitted = {name: jax.jit(fn) for name, fn in fns.items()}
    return {name: (lambda f=f: f(x, w, g).block_until_ready()) for name, f in jitted.items()}


def tensorflow_forms(m: int, k: int, n: int) -> dict:
    import tensorflow as tf

    from fxtrack.frameworks.tensorflow import matmul

    rng = tf.random.Generator.from_seed(0)
    x, w, g = (tf.cast(rng.normal(s), tf.bfloat16) for s in ((m, k), (k, n), (m, n)))
    fns = {"bf16 result": lambda x, w, g: tf.matmul(x, w),
           "f32 result": lambda x, w, g: matmul._dot(x, w, (1, 0)),
           "dx, f32 result": lambda x, w, g: matmul._dot(g, w, (1, 1)),
           "dw, lhs contracts axis 0": lambda x, w, g: matmul._dot(x, g, (0, 0)),
           "dw, x^T written out": lambda x, w, g: matmul._dot(matmul._transposed(x), g, (1, 0))}
    compiled = {name: tf.function(fn, jit_compile=True) for name, fn in fns.items()}
    return {name: (lambda f=f: f(x, w, g).numpy()) for name, f in compiled.items()}


def measure(framework: str, rounds: int, m: int, k: int, n: int) -> dict:
    forms = {"jax": jax_forms, "tensorflow": tensorflow_forms}[framework](m, k, n)
    for run in forms.values():  # compile and warm up
        run(), run()
    times: dict[str, list[float]] = {name: [] for name in forms}
    names = list(forms)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            forms[name]()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", default="jax,tensorflow")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--m", type=int, default=1024, help="rows: batch x tokens")
    parser.add_argument("--k", type=int, default=768)
    parser.add_argument("--n", type=int, default=3072)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one framework per process: its own XLA, nothing else loaded
        print(json.dumps(measure(args.child, args.rounds, args.m, args.k, args.n)))
        return
    print(f"M={args.m} K={args.k} N={args.n}, bf16 operands, {args.rounds} rotated rounds; "
          f"ratio = the form's median / XLA's own bf16 dot's")
    print(f"{'framework':11s} {'form':26s} {'median ms':>10s} {'ratio':>7s}  what")
    for framework in args.frameworks.split(","):
        out = subprocess.run([sys.executable, __file__, "--child", framework, "--rounds",
                              str(args.rounds), "--m", str(args.m), "--k", str(args.k),
                              "--n", str(args.n)], capture_output=True, text=True, check=True)
        times = json.loads(out.stdout.strip().splitlines()[-1])
        base = statistics.median(times["bf16 result"])
        for name, samples in times.items():
            med = statistics.median(samples)
            print(f"{framework:11s} {name:26s} {med:10.2f} {med / base:7.3f}  {FORMS[name]}")


if __name__ == "__main__":
    main()
