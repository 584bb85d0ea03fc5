"""Does fxtrack bend what it measures? For each framework, the throughput fxtrack's timed window
reports against a bare training loop of the same model, batch and precision with nothing of
fxtrack around it.

One fresh interpreter per framework holds both arms, and the arms alternate step by step, so
that the machine's drift (on a shared VM, step times wander by +-25% over tens of seconds with
nothing else running; measured here) hits both alike:
  - fxtrack: the job spec composed from fxtrack's own config (``framework.compile=auto``, the
    default a user gets), the worker's environment (threads), the backend built as the worker
    builds it, each step timed by the same ``timed_window`` every run goes through (timer, load
    sampler, NVML window), throughput as ``step_metrics`` computes it. Only the quiet probe
    before the window is left out (0.5 s of sleep, outside the window): one sampler around the
    whole bench measures other processes instead;
  - bare: the model from the framework's models module, the same optimiser, a plain loop that
    syncs once per step (.item() / .numpy() / block_until_ready), in the mode ``auto`` resolves
    to on this device (checked: the bench stops if they differ).
A round runs ``--steps`` steps (default 1) of each arm, the order alternating from round to
round; its ratio is fxtrack / bare (paired). Reported: the median ratio and a 95% Student-t
interval of the mean log ratio (fxtrack/stats.py), exponentiated. Rounds go on until that
interval is narrower than --target (default 2%) or --max-rounds is reached.

    python bench/overhead.py                      # every installed framework, ViT
    python bench/overhead.py --model llama        # the Llama of issue 35's reference config
    python bench/overhead.py --frameworks torch --min-rounds 100 --max-rounds 1000

Run it on a quiet machine: the share of the cores other processes took over the bench is in
the table.
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
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
# model -> (its size keys, the batch): ViT-B widths, 4 layers, 64-pixel images (17 tokens),
# batch 8; the Llama of the reference bench (bench/reference.py: 4 layers, hidden 256, 8 heads /
# 4 KV heads, MLP 512, vocabulary 4,096, 128 tokens), batch 4.
MODELS = {"vit": ({"layers": 4, "image_size": 64}, 8),
          "llama": ({"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 4, "mlp_dim": 512,
                     "vocab_size": 4096, "seq_len": 128}, 4)}
WARMUP, SEED = 3, 0
# The mode each bare loop runs in: what framework.compile=auto resolves to for the model on a
# CPU (the bench stops where auto resolves to another).
BARE_MODE = {"vit": {"torch": "eager", "tensorflow": "xla", "jax": "jit"},
             "llama": {"torch": "inductor:default", "tensorflow": "xla", "jax": "jit"}}


def _batch(model: str) -> tuple[Any, int, dict[str, Any]]:
    """(arch, batch size, one synthetic batch as NumPy) of ``model`` at the bench's setting."""
    from fxtrack import architectures
    from fxtrack.data import synthetic

    dims, batch = MODELS[model]
    arch = architectures.resolve(model, **dims)
    return arch, batch, synthetic.make_batch(arch, batch, SEED)


def bare_torch(model_name: str) -> Callable[[], Any]:
    import torch
    import torch.nn.functional as F

    from fxtrack.frameworks.base import ADAMW
    from fxtrack.frameworks.torch.models import build

    torch.manual_seed(SEED)
    arch, _, data = _batch(model_name)
    model = build(arch).train()
    opt = torch.optim.AdamW(model.parameters(), lr=ADAMW["lr"], weight_decay=ADAMW["weight_decay"],
                            fused=True)
    if "images" in data:
        x = torch.from_numpy(data["images"]).permute(0, 3, 1, 2).contiguous()
        y = torch.from_numpy(data["labels"]).long()
    else:  # a decoder LM: next-token cross-entropy at every position
        x = torch.from_numpy(data["input_ids"]).long()
        y = torch.from_numpy(data["labels"]).long().flatten()

    def loss_of(x, y):
        return F.cross_entropy(model(x).flatten(0, -2).float(), y)

    if BARE_MODE[model_name]["torch"].startswith("inductor"):  # model and loss in one graph
        loss_of = torch.compile(loss_of)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_of(x, y)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def bare_tensorflow(model_name: str) -> Callable[[], Any]:
    import keras
    import tensorflow as tf

    from fxtrack.frameworks.base import ADAMW
    from fxtrack.frameworks.keras_models import build

    keras.utils.set_random_seed(SEED)
    arch, _, data = _batch(model_name)
    model = build(arch)
    opt = keras.optimizers.AdamW(ADAMW["lr"], weight_decay=ADAMW["weight_decay"])
    x = tf.constant(data["images"] if "images" in data else data["input_ids"])
    y = tf.constant(data["labels"])
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(jit_compile=True)  # XLA: what framework.compile=auto runs for both on a CPU
    def step():
        with tf.GradientTape() as tape:
            loss = ce(y, tf.cast(model(x, training=True), tf.float32))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
        return loss

    return lambda: step().numpy()


def bare_jax(model_name: str) -> Callable[[], Any]:
    import jax
    import optax
    from flax import nnx

    from fxtrack.frameworks.base import ADAMW
    from fxtrack.frameworks.jax.models import build

    arch, _, data = _batch(model_name)
    graphdef, params, rest = nnx.split(build(arch), nnx.Param, ...)
    tx = optax.adamw(ADAMW["lr"], weight_decay=ADAMW["weight_decay"])
    opt_state = tx.init(params)
    x = jax.device_put(data["images"] if "images" in data else data["input_ids"])
    y = jax.device_put(data["labels"])

    @jax.jit
    def step(params, opt_state):
        def loss_of(p):
            logits = nnx.merge(graphdef, p, rest)(x).astype("float32")
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_of)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    state = [params, opt_state]

    def run():
        state[0], state[1], loss = step(*state)
        return loss.block_until_ready()

    return run


def fxtrack_arm(framework: str, model: str, workdir: Path, jax_donate: str = "false"
                ) -> tuple[Any, Callable[[int], float]]:
    """fxtrack's side: the spec the CLI would write for this setting, the worker's environment
    and build; returns (spec, run(steps) -> the samples/s its timed window reports)."""
    from hydra import compose, initialize_config_dir

    from fxtrack.cli import CONF_DIR
    from fxtrack.config import register
    from fxtrack.frameworks.declaration import declaration, import_path
    from fxtrack.worker.protocol import Result
    from fxtrack.config.validate import validate
    from fxtrack.orchestrator.job import job_spec
    from fxtrack.scenarios import timed
    from fxtrack.worker.__main__ import prepare_environment

    register()
    dims, batch_size = MODELS[model]
    overrides = [f"framework={framework}", f"model={model}",
                 *(f"model.{k}={v}" for k, v in dims.items()),
                 f"batch_size={batch_size}", f"warmup_steps={WARMUP}", "hardware=cpu", f"seed={SEED}"]
    if framework == "jax":  # the bare loop does not donate its state: false is like with like;
        overrides.append(f"framework.donate={jax_donate}")  # auto shows what donation costs
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        conf, arch = validate(compose(config_name="config", overrides=overrides))
    spec = job_spec(conf, arch, workdir)
    spec.progress = False
    prepare_environment(spec)  # before any framework import, as in the worker
    backend = import_path(declaration(spec.package).backend)(spec)
    result = Result(result_id=spec.result_id)
    kind, batch, _, warmup = timed.build(backend, result)
    mode = backend.framework.compile_mode_tag(spec.compile, spec.framework_settings)
    if mode != BARE_MODE[model][framework]:
        raise SystemExit(f"{framework}: framework.compile=auto resolved to {mode} on {kind} for "
                         f"{model}, but the bare loop runs {BARE_MODE[model][framework]}; this "
                         "bench compares like with like")
    for _ in range(warmup):
        backend.train_step()

    def run(steps: int) -> float:
        times, *_ = timed.timed_window(spec, kind, backend.train_step, 0, steps,
                                       wait_for_quiet=False)
        return timed.step_metrics(times, batch, compiled=timed.compiles(spec))[
            "throughput_samples_per_s"]

    return spec, run


def bare_arm(framework: str, model: str) -> Callable[[int], float]:
    """The bare loop's side: built once and warmed up; run(steps) -> samples/s."""
    step = BARE[framework](model)
    batch = MODELS[model][1]
    for _ in range(WARMUP):
        step()

    def run(steps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        return batch * steps / (time.perf_counter() - t0)

    return run


BARE = {"torch": bare_torch, "tensorflow": bare_tensorflow, "jax": bare_jax}


def ratio_interval(fx: list[float], bare: list[float]) -> tuple[float, float, float]:
    """(median ratio, 95% low, 95% high) of paired fxtrack / bare rounds: the Student-t interval
    of the mean log ratio, exponentiated (one round: low = high = the ratio)."""
    from fxtrack import stats

    logs = [math.log(f / b) for f, b in zip(fx, bare)]
    ci = stats.t_interval(logs)
    return stats.median([f / b for f, b in zip(fx, bare)]), math.exp(ci.low), math.exp(ci.high)


def child(framework: str, args: argparse.Namespace) -> None:
    """Both arms of one framework in this interpreter; prints progress and a final JSON line."""
    from fxtrack.measure import host_load as load

    with tempfile.TemporaryDirectory() as tmp:
        spec, fx = fxtrack_arm(framework, args.model, Path(tmp), args.jax_donate)
        arms = {"fxtrack": fx, "bare": bare_arm(framework, args.model)}
        got: dict[str, list[float]] = {arm: [] for arm in arms}
        with load.LoadSampler(spec.cpu_threads) as host:  # other processes over the whole bench
            for r in range(args.max_rounds):
                for arm in (("fxtrack", "bare") if r % 2 == 0 else ("bare", "fxtrack")):
                    got[arm].append(arms[arm](args.steps))
                med, low, high = ratio_interval(got["fxtrack"], got["bare"])
                done = r + 1 >= args.min_rounds and high - low < args.target
                if (r + 1) % 25 == 0 or done:
                    print(f"{framework} round {r + 1}: ratio so far {med:.3f} [{low:.3f}, {high:.3f}]",
                          file=sys.stderr, flush=True)
                if done:
                    break
    print(json.dumps({"framework": framework, "mode": BARE_MODE[args.model][framework],
                      "rounds": len(got["bare"]), "other_cpu_frac": host.other_cpu_frac,
                      "fxtrack": got["fxtrack"], "bare": got["bare"],
                      "ratio": ratio_interval(got["fxtrack"], got["bare"])}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frameworks", default=",".join(BARE))
    parser.add_argument("--model", choices=sorted(MODELS), default="vit")
    parser.add_argument("--steps", type=int, default=1, help="steps per arm per round")
    parser.add_argument("--min-rounds", type=int, default=50)
    parser.add_argument("--max-rounds", "--rounds", type=int, default=600, dest="max_rounds")
    parser.add_argument("--target", type=float, default=0.02,
                        help="stop when the ratio's 95%% interval is narrower than this")
    parser.add_argument("--jax-donate", choices=("false", "auto", "true"), default="false",
                        help="fxtrack's framework.donate for the JAX arm (the bare loop never "
                             "donates): false compares like with like, auto shows its cost")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args)
        return
    rows = []
    for fw in args.frameworks.split(","):
        if not importlib.util.find_spec({"torch": "torch", "tensorflow": "tensorflow", "jax": "jax"}[fw]):
            print(f"{fw}: not installed, skipped")
            continue
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        out = subprocess.run([sys.executable, __file__, "--child", fw, *sys.argv[1:]], env=env,
                             stdout=subprocess.PIPE, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    dims, batch_size = MODELS[args.model]
    print(f"\n{args.model} {dims}, batch {batch_size}, {args.steps} steps per arm per round, fp32, CPU, "
          f"{os.cpu_count()} cores; ratio = fxtrack / bare per round, median [95% t interval of the "
          "mean log ratio]")
    print(f"{'framework':<11} {'mode':<12} {'rounds':>6} {'other CPU':>9}  {'fxtrack / bare':<26} "
          f"{'fxtrack samples/s':>17} {'bare samples/s':>14}")
    from fxtrack import stats
    for row in rows:
        m, lo, hi = row["ratio"]
        other = "n/a" if row["other_cpu_frac"] is None else f"{row['other_cpu_frac']:.0%}"
        print(f"{row['framework']:<11} {row['mode']:<12} {row['rounds']:>6} {other:>9}  "
              f"{f'{m:.3f} [{lo:.3f}, {hi:.3f}]':<26} {stats.median(row['fxtrack']):>17.2f} "
              f"{stats.median(row['bare']):>14.2f}")


if __name__ == "__main__":
    main()
