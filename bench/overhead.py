"""Does fxtrack bend what it measures? For each framework, fxtrack's reported throughput against
a bare training loop of the same model, batch and precision with nothing of fxtrack around it.

Each round runs three arms, in an order that rotates from round to round so that no arm always
goes first: fxtrack in the bare loop's mode, the bare loop, and fxtrack with its default
``framework.compile=auto`` (what a user gets without asking). A round's ratio is fxtrack / bare
from the same round (paired, so slow drift in the machine cancels). Reported: the median ratio
and a 95% Student-t interval of the mean log ratio (fxtrack/stats.py), exponentiated. Rounds go
on until that interval is narrower than --target (default 2%) or --max-rounds is reached.

    python bench/overhead.py                      # every installed framework
    python bench/overhead.py --frameworks torch --min-rounds 5 --max-rounds 40

Run it on a quiet machine: each round's host_other_cpu_frac is printed, and rounds in which
other processes took more than 10% of the cores are counted in the table.

The bare loops below are deliberately plain: the model from each framework's models module,
the same optimiser, a warm-up, then a wall-clock loop that syncs once per step like fxtrack
(.item() / .numpy() / block_until_ready).
Target: every ratio (fxtrack / bare) >= 0.98, with an interval that shows it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
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


def fxtrack_run(framework: str, workdir: Path, compile_mode: str) -> tuple[float, float]:
    """One fxtrack run; (its logged throughput, host_other_cpu_frac or nan)."""
    env = dict(os.environ, FXTRACK_HOME=str(workdir / "home"), MLFLOW_TRACKING_URI=
               f"sqlite:///{workdir / 'mlflow.db'}")
    # The peak-FLOP/s calibration is cached across runs (not per temporary directory): it costs
    # minutes, not throughput, and a quiet machine caches it once.
    env.setdefault("FXTRACK_CACHE", str(Path.home() / ".cache" / "fxtrack"))
    overrides = [f"framework={framework}", "model=vit", *(f"model.{k}={v}" for k, v in MODEL.items()),
                 f"batch_size={BATCH}", f"steps={STEPS}", f"warmup_steps={WARMUP}",
                 f"framework.compile={compile_mode}", "hardware=cpu",
                 f"hydra.run.dir={workdir / 'run'}"]
    subprocess.run([sys.executable, "-m", "fxtrack", *overrides], cwd=workdir, env=env, check=True,
                   capture_output=True, text=True)
    metrics = json.loads((workdir / "run" / "result.json").read_text())["metrics"]
    return metrics["throughput_samples_per_s"], metrics.get("host_other_cpu_frac", math.nan)


def bare_run(framework: str) -> float:
    """The bare loop in a fresh interpreter, as isolated as fxtrack's worker."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu",
               TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, __file__, "--bare", framework], env=env, check=True,
                         capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def ratio_interval(fx: list[float], bare: list[float]) -> tuple[float, float, float]:
    """(median ratio, 95% low, 95% high) of paired fxtrack / bare rounds: the Student-t interval
    of the mean log ratio, exponentiated (one round: low = high = the ratio)."""
    from fxtrack import stats

    logs = [math.log(f / b) for f, b in zip(fx, bare)]
    ci = stats.t_interval(logs)
    return stats.median([f / b for f, b in zip(fx, bare)]), math.exp(ci.low), math.exp(ci.high)


def measure(fw: str, args: argparse.Namespace) -> dict:
    """Alternated rounds of the three arms until the interval is narrow enough."""
    arms = {"fxtrack": lambda tmp: fxtrack_run(fw, tmp, COMPILE[fw]),
            "bare": lambda tmp: (bare_run(fw), math.nan),
            "default": lambda tmp: fxtrack_run(fw, tmp, "auto")}
    order = list(arms)
    got: dict[str, list[float]] = {arm: [] for arm in arms}
    busy = 0
    for r in range(args.max_rounds):
        fracs = []
        for arm in order[r % 3:] + order[:r % 3]:  # rotate which arm goes first
            with tempfile.TemporaryDirectory() as tmp:
                thr, frac = arms[arm](Path(tmp))
            got[arm].append(thr)
            fracs.append(frac)
        worst = max((f for f in fracs if not math.isnan(f)), default=math.nan)
        busy += worst > 0.10
        med, low, high = ratio_interval(got["fxtrack"], got["bare"])
        print(f"{fw} round {r + 1}: fxtrack {got['fxtrack'][-1]:.2f}, bare {got['bare'][-1]:.2f}, "
              f"default {got['default'][-1]:.2f} samples/s; host_other_cpu_frac {worst:.0%}; "
              f"ratio so far {med:.3f} [{low:.3f}, {high:.3f}]", flush=True)
        if r + 1 >= args.min_rounds and high - low < args.target:
            break
    return {"framework": fw, "rounds": len(got["bare"]), "contended": busy,
            "fxtrack": ratio_interval(got["fxtrack"], got["bare"]),
            "default": ratio_interval(got["default"], got["bare"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", default=",".join(BARE))
    parser.add_argument("--min-rounds", type=int, default=3)
    parser.add_argument("--max-rounds", "--rounds", type=int, default=30, dest="max_rounds")
    parser.add_argument("--target", type=float, default=0.02,
                        help="stop when the ratio's 95%% interval is narrower than this")
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
        rows.append(measure(fw, args))
    print(f"\nvit {MODEL}, batch {BATCH}, {STEPS} timed steps, fp32, CPU; ratio = fxtrack / bare "
          "per round, median [95% t interval of the mean log ratio]")
    print(f"{'framework':<11} {'rounds':>6} {'contended':>9}  {'fxtrack / bare':<26} "
          f"{'default compile / bare':<26}")
    for row in rows:
        cells = [f"{m:.3f} [{lo:.3f}, {hi:.3f}]" for m, lo, hi in (row["fxtrack"], row["default"])]
        print(f"{row['framework']:<11} {row['rounds']:>6} {row['contended']:>9}  {cells[0]:<26} "
              f"{cells[1]:<26}")


if __name__ == "__main__":
    main()
