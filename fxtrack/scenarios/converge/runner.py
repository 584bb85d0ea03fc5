"""scenario=converge: train on real data (``data=``, fxtrack.data) until the held-out metric
meets ``scenario.target``, evaluating every ``scenario.eval_every`` steps, within
``scenario.max_epochs``. One seeded permutation per epoch orders the batches and one schedule
formula (linear warm-up, then cosine to 0: ``lr_at``) sets AdamW's rate, in every framework.

Clocks: ``time_to_target_s`` counts training steps only, up to the first evaluation that meets
the target, less the first step's compilation (``compile_time_s``, as the timer defines it:
the first step's excess over the median step); evaluations are timed apart (``eval_time_s``).
A run that misses the target within its budget is FINISHED with ``reached_target`` 0.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Optional

from fxtrack import data, families
from fxtrack.frameworks.base import Backend
from fxtrack.worker.protocol import Result
from fxtrack.measure import host_load as load
from fxtrack.measure.timer import eprint
from fxtrack.scenarios import timed
from fxtrack.scenarios.registry import options_of

LN2 = math.log(2.0)
# what each metric's better direction is (the target is met at or beyond it)
HIGHER_IS_BETTER = {"accuracy": True, "loss": False, "bits_per_byte": False}


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """The learning rate of optimiser step ``step`` (0-based) of ``total``: linear warm-up over
    ``warmup`` steps to ``peak``, then cosine decay to 0 at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def met(metric: str, value: float, target: float) -> bool:
    return value >= target if HIGHER_IS_BETTER[metric] else value <= target


def score(metric: str, logits: Any, labels: Any, weights: Any = None) -> tuple[float, int]:
    """(sum over the batch's predictions of the metric's per-prediction figure, predictions):
    correct ones for accuracy; cross-entropy in nats (loss) or bits (bits_per_byte). Given
    ``weights`` (0/1 per prediction: a masked LM's ``mlm_weights``, ``fxtrack.data.targets``),
    only the predictions weighted 1 count."""
    import numpy as np

    logits = logits.reshape(-1, logits.shape[-1])
    labels = np.asarray(labels).reshape(-1)
    if weights is not None:
        kept = np.asarray(weights).reshape(-1) > 0
        logits, labels = logits[kept], labels[kept]
    logits = logits.astype(np.float64)
    if metric == "accuracy":
        return float((logits.argmax(-1) == labels).sum()), len(labels)
    shifted = logits - logits.max(-1, keepdims=True)
    nll = np.log(np.exp(shifted).sum(-1)) - shifted[np.arange(len(labels)), labels]
    return float(nll.sum() / (LN2 if metric == "bits_per_byte" else 1.0)), len(labels)


def time_to_target(history: list[dict[str, float]], metric: str, target: float,
                   compile_time_s: float) -> Optional[dict[str, float]]:
    """The first evaluation in ``history`` (each ``step``, ``train_s``: training seconds so far,
    ``value``) that meets ``target``, as ``time_to_target_s`` (its training seconds less the
    compilation) and ``steps_to_target``; None when none does. The logged figure is this
    function of the logged history (tests recompute it)."""
    for point in history:
        if met(metric, point["value"], target):
            return {"time_to_target_s": point["train_s"] - compile_time_s,
                    "steps_to_target": point["step"]}
    return None


def trajectory(losses: list[float], reference: list[float],
               tolerance: float) -> tuple[float, str]:
    """(largest relative difference over the first common steps, ``matched`` or
    ``diverged@<step>``, the first 1-based step beyond ``tolerance``): the per-step training
    losses of one run against a reference run's (the first framework's) from the same start."""
    worst, first_bad = 0.0, None
    for step, (mine, theirs) in enumerate(zip(losses, reference), start=1):
        gap = abs(mine - theirs) / max(abs(theirs), 1e-12)
        worst = max(worst, gap)
        if first_bad is None and not gap <= tolerance:  # a NaN loss diverges too
            first_bad = step
    return worst, "matched" if first_bad is None else f"diverged@{first_bad}"


def batches(n: int, batch: int, seed: int, total: int) -> Any:
    """The training samples of each of ``total`` steps: each epoch one seeded permutation
    (``fxtrack.data.epoch_order``) cut into ``batch``-sample batches, its last partial one
    dropped."""
    step, epoch = 0, 0
    while True:
        order = data.epoch_order(n, seed, epoch)
        for b in range(n // batch):
            if step == total:
                return
            yield order[b * batch:(b + 1) * batch]
            step += 1
        epoch += 1


def run_seed(spec: Any) -> int:
    """The seed a converge run trains from: ``seed`` + which of ``repeats`` it is."""
    return spec.seed + spec.repeat


def too_few(split: data.Split, seq_len: int, batch: int) -> Optional[str]:
    """Why ``split`` cannot fill one training batch of ``batch``, or None."""
    have = data.samples(split, seq_len)
    if have >= batch:
        return None
    return (f"data={split.name} has {have} training samples, fewer than one batch of {batch}; "
            "set a smaller batch_size")


@dataclasses.dataclass
class SettingsOf:  # what settings() reads of a JobSpec (the config check makes one)
    arch: dict = dataclasses.field(default_factory=dict)
    data: dict = dataclasses.field(default_factory=dict)
    batch_size: Optional[int] = None


# The options a run cannot start without: each set, or the family's default for the dataset
NEEDED = ("metric", "target", "eval_every", "max_epochs", "lr")
EVALS_PER_EPOCH = 4  # a suggested eval_every's evaluations an epoch
SUGGESTED_STEPS = 500  # a suggested budget's steps (the declared defaults' run 310 to 1,714)


def settings(spec: Any, options: Any) -> dict[str, Any]:
    """The run's metric, target, budget, rate and batch: each option, else the family's
    default for this dataset (fxtrack.families.quality); ValueError naming every one neither
    sets, each with a value that fits the data (``missing_settings``)."""
    declared = families.of(spec.arch).quality.get(spec.data["name"])
    out = {}
    for key in (*NEEDED, "max_steps"):  # max_steps: None is no cap
        value = getattr(options, key)
        out[key] = getattr(declared, key) if value is None and declared is not None else value
    out["batch_size"] = spec.batch_size or (declared.batch_size if declared else 32)
    missing = [key for key in NEEDED if out[key] is None]
    if missing:
        raise ValueError(missing_settings(spec, out, missing))
    return out


def missing_settings(spec: Any, chosen: dict[str, Any], missing: list[str]) -> str:
    """One line naming every setting in ``missing`` with a value that fits the data (read
    here: the error comes before any work, so one message must carry them all): a metric the
    family scores, a target halfway from what a model that learned nothing scores to a perfect
    one, about ``EVALS_PER_EPOCH`` evaluations an epoch, a budget of about ``SUGGESTED_STEPS``
    steps, and the peak rate of the declared defaults."""
    family = families.of(spec.arch)
    split = data.load(spec.data)
    seq_len = int(spec.arch.get("dims", {}).get("seq_len", 1))
    batch = chosen["batch_size"]
    if too_few(split, seq_len, batch) is not None:  # no value fits until a batch does
        return too_few(split, seq_len, batch)
    per_epoch = data.samples(split, seq_len) // batch
    metric = chosen["metric"] or family.converge_metrics[0]
    blind = blind_score(metric, split)
    target = float(f"{blind + (1.0 - blind) / 2 if HIGHER_IS_BETTER[metric] else blind / 2:.2g}")
    rates = [q.lr for name in families.names() for q in families.get(name).quality.values()]
    what = {"images": "images", "signals": "signals", "bytes": "windows"}[split.kind]
    classes = (f"{split.classes} classes" if split.y_train is not None
               else f"vocabulary {split.classes}")
    values = {
        "metric": (metric, "the labels are class ids" if split.y_train is not None
                   else "a byte corpus"),
        "target": (target, f"halfway from the {blind:.3g} of a model that learned only the "
                   f"{'labels' if split.y_train is not None else 'bytes'}' frequencies to a "
                   f"perfect {1 if HIGHER_IS_BETTER[metric] else 0}, or the quality you need"),
        "eval_every": (max(1, per_epoch // EVALS_PER_EPOCH),
                       f"about {EVALS_PER_EPOCH} evaluations an epoch"),
        "max_epochs": (math.ceil(SUGGESTED_STEPS / per_epoch),
                       f"about {SUGGESTED_STEPS} steps"),
        "lr": (statistics.median(rates), "AdamW's peak rate in the declared defaults"),
    }
    return (f"scenario=converge on data={split.name} needs {len(missing)} setting(s) that "
            f"model family {family.name!r} has no default for on this data "
            f"({data.samples(split, seq_len):,} training {what} of shape {split.shape}, "
            f"{classes}, batch {batch}: {per_epoch} steps an epoch); values that "
            f"fit it: set " + " ".join(f"scenario.{k}={values[k][0]}" for k in missing)
            + " (" + "; ".join(f"{k}: {values[k][1]}" for k in missing) + ")")


def blind_score(metric: str, split: data.Split) -> float:
    """``metric`` of a model that learned nothing but the label frequencies of the training
    split: the commonest label's share (accuracy), or their entropy (in nats: loss; in bits:
    bits_per_byte)."""
    import numpy as np

    labels = split.y_train if split.y_train is not None else split.x_train
    shares = np.bincount(np.asarray(labels, dtype=np.int64)) / len(labels)
    if metric == "accuracy":
        return float(shares.max())
    shares = shares[shares > 0]
    nats = float(-(shares * np.log(shares)).sum())
    return nats / LN2 if metric == "bits_per_byte" else nats


def run(backend: Backend, result: Result) -> None:
    """Fill ``result`` (docs/contract.md, scenario=converge)."""
    spec, options = backend.spec, options_of(backend.spec)
    trainer = backend.capability("converge")  # before the build: NotSupported costs nothing
    # repeats=N are N seeded runs (MLPerf's): repeat k starts from, and orders by, seed + k
    spec.seed = run_seed(spec)
    s = settings(spec, options)
    split = data.load(spec.data)
    seq_len = int(spec.arch["dims"].get("seq_len", 1))
    n_train = data.samples(split, seq_len)
    batch = s["batch_size"]
    steps_per_epoch = n_train // batch  # the last partial batch dropped
    total = steps_per_epoch * s["max_epochs"]
    if s["max_steps"] is not None:
        total = min(total, s["max_steps"])
    if total < 1:  # validation refuses it; a spec written by other means gets the same line
        raise ValueError(too_few(split, seq_len, batch))
    warmup = max(1, round(total * options.warmup_frac))
    spec.batch_size = batch
    timed.build(backend, result)
    result.resolved.update(batch_size=batch, steps=total, metric=s["metric"],
                           dataset=dataset_record(split, spec.data),
                           scenario={k: v for k, v in s.items() if k != "batch_size"})
    held = list(range(min(options.eval_samples, data.samples(split, seq_len, held=True))))

    family = families.of(spec.arch)  # a byte corpus' batch form is the family's

    def evaluate() -> float:
        total_score, count = 0.0, 0
        for start in range(0, len(held), batch):
            part = data.batch(split, held[start:start + batch], seq_len, held=True, family=family)
            figure, n = score(s["metric"], trainer.outputs(backend, part), *data.targets(part))
            total_score, count = total_score + figure, count + n
        return total_score / count

    train_s, eval_s, step_times, losses = 0.0, 0.0, [], []
    history: list[dict[str, float]] = []
    reached = False
    eprint(f"[fxtrack] converge: {s['metric']} to {s['target']} on data={split.name}, "
           f"{steps_per_epoch} steps/epoch, at most {total} steps ({s['max_epochs']} epochs)")
    # the training steps are the timed work: other processes' share of the cores over them is
    # the contended caveat every scenario's figures carry (evaluation is this process's own)
    before = load.wait_for_idle(spec.wait_for_idle_s, spec.cpu_threads, eprint)
    during = load.LoadSampler(spec.cpu_threads).start()
    for step, rows in enumerate(batches(n_train, batch, spec.seed, total), start=1):
        host = data.batch(split, rows, seq_len, family=family, seed=spec.seed)
        t0 = time.perf_counter()
        handle = trainer.train_on_host(backend, host, lr_at(step - 1, total, s["lr"], warmup))
        step_times.append(time.perf_counter() - t0)
        train_s += step_times[-1]
        losses.append(backend.loss_value(handle))
        if not math.isfinite(losses[-1]):  # the guard fails the run; no step would mend it
            break
        if step % s["eval_every"] and step != total:
            continue
        t0 = time.perf_counter()
        value = evaluate()
        eval_s += time.perf_counter() - t0
        history.append({"step": step, "train_s": train_s, "value": value})
        eprint(f"[fxtrack] step {step}: held-out {s['metric']} {value:.4f}")
        if met(s["metric"], value, s["target"]):
            reached = True
            break
    figures, contended = load.window_figures(before, during.stop())
    result.metrics.update(figures)
    result.tags["contended"] = "true" if contended else "false"
    result.tags["data_digest"] = split.digest  # the data's identity, wherever its file lies
    compile_s = (max(0.0, step_times[0] - statistics.median(step_times[1:]))
                 if len(step_times) > 1 else 0.0)
    m = result.metrics
    m.update(eval_time_s=eval_s, compile_time_s=compile_s, reached_target=float(reached),
             train_time_s=train_s - compile_s, steps_trained=float(len(losses)),
             param_count=float(backend.param_count()),
             loss_first=losses[0], loss_last=losses[-1])
    if history:  # none when the loss went NaN before the first evaluation
        m[f"final_eval_{s['metric']}"] = history[-1]["value"]
    hit = time_to_target(history, s["metric"], s["target"], compile_s)
    if hit is not None:
        m.update(time_to_target_s=hit["time_to_target_s"],
                 steps_to_target=float(hit["steps_to_target"]),
                 samples_to_target=float(hit["steps_to_target"] * batch))
    result.series["loss"] = losses
    result.series[f"eval_{s['metric']}"] = [p["value"] for p in history]
    result.series["eval_train_s"] = [p["train_s"] - compile_s for p in history]
    for key in (f"eval_{s['metric']}", "eval_train_s"):  # logged at the step evaluated
        result.series_steps[key] = [int(p["step"]) for p in history]
    if not all(math.isfinite(x) for x in losses):
        result.guard = "loss is not finite"
    else:  # a model worth evaluating again (model.from_run)
        keep_model(backend, trainer, result)


def keep_model(backend: Backend, trainer: Any, result: Result) -> None:
    """The trained weights in ``model/`` beside the result, under the shared start's names and
    layout (``initial.save``: every framework loads them back), and the model as ONNX where
    the framework's deployment capability exports it; the orchestrator logs the folder as the
    run's MLflow logged model (``Result.artifacts``: ``weights``, ``model``)."""
    from fxtrack.frameworks import initial

    trained = trainer.weights(backend)  # every process: FSDP's shards are gathered together
    if not timed.writes(backend.spec):
        return
    folder = Path(backend.spec.result_path).parent / "model"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    weights = initial.save(folder / initial.WEIGHTS_FILE, trained)
    result.artifacts["weights"] = str(weights)
    if backend.spec.devices * backend.spec.nodes > 1:  # an export traces one process's model
        eprint("[fxtrack] converge: the trained model is kept as weights only (no ONNX export "
               "of a model spread over devices)")
        return
    try:
        exporter = backend.capability("onnx_export")
        result.artifacts["model"] = str(exporter.to_onnx(backend, folder / "model.onnx"))
    except Exception as e:  # noqa: BLE001 - the run's figures stand; its weights load anywhere
        eprint(f"[fxtrack] converge: the trained model is kept as weights only (no ONNX: "
               f"{str(e).splitlines()[0] if str(e) else type(e).__name__})")


def dataset_record(split: data.Split, cfg: dict[str, Any]) -> dict[str, Any]:
    """What the tracking layer logs as the run's MLflow dataset (tracking.records)."""
    return {"name": split.name, "digest": split.digest, "source": split.source,
            "kind": split.kind, "shape": list(split.shape), "classes": split.classes,
            "sizes": split.sizes(), "holdout": cfg.get("holdout")}
