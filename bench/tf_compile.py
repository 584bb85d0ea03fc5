"""TensorFlow ResNet-50 training step time on the CPU in each compile mode, side by side: XLA
(``jit_compile=True``), a plain ``tf.function`` graph, and eager. The figure behind fxtrack's
compile rule for TensorFlow on a CPU (its declaration, fxtrack/frameworks/tensorflow/__init__.py).

    python bench/tf_compile.py                   # 64-px images, batch 4, 5 rounds
    python bench/tf_compile.py --rounds 3 --steps 3 --image-size 32

Each round times ``--steps`` steps of every mode, the modes in a rotated order each round, so
that drift in the machine's load hits every mode alike; the table gives each mode's median
ms/step over the rounds and its ratio to the fastest. The three modes share one model and
optimiser (the one the worker builds): it is the same arithmetic, only the execution differs.
Timing figures from a shared machine are contended; say so when quoting them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, whatever the machine has


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternated rounds (default 5)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per mode per round")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--modes", default="xla,tf.function,eager")
    args = parser.parse_args()

    import keras
    import tensorflow as tf

    from fxtrack import architectures
    from fxtrack.frameworks import keras_models as models
    from fxtrack.frameworks.tensorflow import data, train

    arch = architectures.resolve("resnet50", image_size=args.image_size)
    keras.utils.set_random_seed(0)
    model = models.build(arch)
    opt = train.optimizer(arch, "fp32", args.batch_size)
    batch = data.device_batch(arch, args.batch_size, 0, "/CPU:0")
    strategy = tf.distribute.get_strategy()
    graph = train.make_step(model, opt, strategy, False)
    # eager: the tf.function step run op by op (run_functions_eagerly, below)
    steps = {"xla": train.make_step(model, opt, strategy, True), "tf.function": graph,
             "eager": graph}
    modes = args.modes.split(",")

    def run(mode: str, n: int) -> float:
        """Seconds per step over ``n`` steps of ``mode`` (each step synced by fetching the loss)."""
        tf.config.run_functions_eagerly(mode == "eager")  # eager: the same step, op by op
        try:
            t0 = time.perf_counter()
            for _ in range(n):
                steps[mode](batch).numpy()
            return (time.perf_counter() - t0) / n
        finally:
            tf.config.run_functions_eagerly(False)

    for mode in modes:  # compile / trace once, untimed
        t0 = time.perf_counter()
        run(mode, 1)
        print(f"{mode:>12}: first step (trace/compile) {time.perf_counter() - t0:.1f} s", flush=True)

    times: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]  # rotate who goes first
        for mode in order:
            times[mode].append(run(mode, args.steps))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{m} {times[m][-1] * 1e3:.0f} ms" for m in modes), flush=True)

    medians = {m: statistics.median(v) for m, v in times.items()}
    best = min(medians.values())
    print(f"\nTF {tf.__version__} ResNet-50 {args.image_size}px batch {args.batch_size} on CPU, "
          f"{args.rounds} rounds x {args.steps} steps (median ms/step; ratio to the fastest)")
    print(f"{'mode':>12} {'median ms':>10} {'min':>8} {'max':>8} {'x fastest':>10}")
    for m in modes:
        v = times[m]
        print(f"{m:>12} {medians[m] * 1e3:>10.0f} {min(v) * 1e3:>8.0f} {max(v) * 1e3:>8.0f} "
              f"{medians[m] / best:>10.2f}")


if __name__ == "__main__":
    main()
