"""Does fxtrack bend what it measures? For each framework, fxtrack's reported throughput against
a bare training loop of the same model, batch and precision with nothing of fxtrack around it,
alternated in one run (fxtrack, bare, fxtrack, bare, ...), medians compared.

    python bench/overhead.py                      # every installed framework, 3 rounds
    python bench/overhead.py --frameworks torch --rounds 5

The bare loops below are deliberately plain: the model from each framework's models module,
the same optimiser, a warm-up, then a wall-clock loop that syncs once per step like fxtrack
(.item() / .numpy() / block_until_ready).
Target: every ratio (fxtrack / bare) >= 0.98.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A small but real setting: ViT-B widths, 4 layers, 64-pixel images (17 tokens), batch 8.
MODEL = {"layers": 4, "image_size": 64}
BATCH, STEPS, WARMUP = 8, 20, 3


def bare_torch() -> float:
    import torch
    import torch.nn.functional as F

    from fxtrack import architectures, synthetic
    from fxtrack.frameworks.base import ADAMW
    from fxtrack.frameworks.torch.models import build

    torch.manual_seed(0)
    arch = architectures.resolve("vit", **MODEL)
    model = build(arch).train()
    opt = torch.optim.AdamW(model.parameters(), lr=ADAMW["lr"], weight_decay=ADAMW["weight_decay"],
                            fused=True)
    data = synthetic.make_batch(arch, BATCH, 0)
    x = torch.from_numpy(data["images"]).permute(0, 3, 1, 2).contiguous()
    y = torch.from_numpy(data["labels"]).long()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return _loop(step)


def bare_tensorflow() -> float:
    import keras
    import tensorflow as tf

    from fxtrack import architectures, synthetic
    from fxtrack.frameworks.base import ADAMW
    from fxtrack.frameworks.tensorflow.models import build

    keras.utils.set_random_seed(0)
    arch = architectures.resolve("vit", **MODEL)
    model = build(arch)
    opt = keras.optimizers.AdamW(ADAMW["lr"], weight_decay=ADAMW["weight_decay"])
    data = synthetic.make_batch(arch, BATCH, 0)
    x, y = tf.constant(data["images"]), tf.constant(data["labels"])
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function  # a graph, no XLA: what fxtrack runs with framework.compile=false
    def step():
        with tf.GradientTape() as tape:
            loss = ce(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
        return loss

    return _loop(lambda: step().numpy())


def bare_jax() -> float:
    import jax
    import optax
    from flax import nnx

    from fxtrack import architectures, synthetic
    from fxtrack.frameworks.base import ADAMW
    from fxtrack.frameworks.jax.models import build

    arch = architectures.resolve("vit", **MODEL)
    graphdef, params, rest = nnx.split(build(arch), nnx.Param, ...)
    tx = optax.adamw(ADAMW["lr"], weight_decay=ADAMW["weight_decay"])
    opt_state = tx.init(params)
    data = synthetic.make_batch(arch, BATCH, 0)
    x, y = jax.device_put(data["images"]), jax.device_put(data["labels"])

    @jax.jit
    def step(params, opt_state):
        def loss_of(p):
            logits = nnx.merge(graphdef, p, rest)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_of)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    state = [params, opt_state]

    def run():
        state[0], state[1], loss = step(*state)
        return loss.block_until_ready()

    return _loop(run)


def _loop(step) -> float:
    for _ in range(WARMUP):
        step()
    t0 = time.perf_counter()
    for _ in range(STEPS):
        step()
    return BATCH * STEPS / (time.perf_counter() - t0)


BARE = {"torch": bare_torch, "tensorflow": bare_tensorflow, "jax": bare_jax}
# Each framework in its default fast mode, the same in both arms: PyTorch eager, a TensorFlow
# graph without XLA, JAX jitted.
COMPILE = {"torch": "false", "tensorflow": "false", "jax": "true"}


def fxtrack_run(framework: str, workdir: Path) -> float:
    """One fxtrack run in the same mode as the bare loop; its logged throughput."""
    env = dict(os.environ, FXTRACK_HOME=str(workdir / "home"), MLFLOW_TRACKING_URI=
               f"sqlite:///{workdir / 'mlflow.db'}")
    overrides = [f"framework={framework}", "model=vit", *(f"model.{k}={v}" for k, v in MODEL.items()),
                 f"batch_size={BATCH}", f"steps={STEPS}", f"warmup_steps={WARMUP}",
                 f"framework.compile={COMPILE[framework]}", "hardware=cpu",
                 f"hydra.run.dir={workdir / 'run'}"]
    subprocess.run([sys.executable, "-m", "fxtrack", *overrides], cwd=workdir, env=env, check=True,
                   capture_output=True, text=True)
    result = json.loads((workdir / "run" / "result.json").read_text())
    return result["metrics"]["throughput_samples_per_s"]


def bare_run(framework: str) -> float:
    """The bare loop in a fresh interpreter, as isolated as fxtrack's worker."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu",
               TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, __file__, "--bare", framework], env=env, check=True,
                         capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", default=",".join(BARE))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bare", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        print(BARE[args.bare]())
        return
    rows = []
    for fw in args.frameworks.split(","):
        if not importlib.util.find_spec({"torch": "torch", "tensorflow": "tensorflow", "jax": "jax"}[fw]):
            print(f"{fw}: not installed, skipped")
            continue
        fx, bare = [], []
        for r in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                fx.append(fxtrack_run(fw, Path(tmp)))
            bare.append(bare_run(fw))
            print(f"{fw} round {r + 1}: fxtrack {fx[-1]:.2f}, bare {bare[-1]:.2f} samples/s", flush=True)
        rows.append((fw, statistics.median(fx), statistics.median(bare)))
    print(f"\nvit {MODEL}, batch {BATCH}, {STEPS} timed steps, fp32, CPU, medians of {args.rounds} rounds")
    print(f"{'framework':<11} {'fxtrack':>9} {'bare':>9} {'ratio':>7}")
    for fw, fx, bare in rows:
        print(f"{fw:<11} {fx:>9.2f} {bare:>9.2f} {fx / bare:>7.3f}")


if __name__ == "__main__":
    main()
