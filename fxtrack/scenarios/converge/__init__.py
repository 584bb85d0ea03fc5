"""scenario=converge: training on real data to a held-out target: its runner, its checks (the
config's before any work, each run's trajectory against the sweep's first) and its report
section (MLPerf's rule for the repeats a time to target stands on)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from fxtrack.metrics import HIGHER, LOWER, NEITHER, Metric
from fxtrack.scenarios.options import Options, at_least, positive
from fxtrack.scenarios.registry import MEASURE, Objective, Scenario, register


# scenario=converge's held-out metrics and the range a target of each may take
CONVERGE_METRICS = {"accuracy": (0.0, 1.0), "loss": (0.0, math.inf), "bits_per_byte": (0.0, 8.0)}


@dataclasses.dataclass
class ConvergeOptions(Options):
    """Train on real data (``data=``) until the held-out ``metric`` meets ``target``, evaluating
    every ``eval_every`` steps, within ``max_epochs``; each None: the family's default for the
    dataset (fxtrack.families.quality)."""

    name: str = "converge"
    metric: Optional[str] = None  # accuracy (higher is better) | loss | bits_per_byte (lower)
    target: Optional[float] = None
    eval_every: Optional[int] = None  # optimiser steps between evaluations
    max_epochs: Optional[int] = None  # the budget: a run that misses the target by then ends
    max_steps: Optional[int] = None  # and at most this many optimiser steps (None: no cap)
    lr: Optional[float] = None  # AdamW's peak learning rate
    warmup_frac: float = 0.05  # share of the budget's steps warming up linearly, then cosine
    eval_samples: int = 1024  # held-out samples evaluated (the first ones: the same each time)
    trajectory_steps: int = 10  # the first K training losses compared with the first framework's
    trajectory_tol: float = 1e-3  # relative difference per step beyond which they diverged
    quality_tol: float = 0.01  # a lever's final metric this much worse than fp32's: lost

    def __post_init__(self) -> None:
        super().__post_init__()
        positive("scenario.", eval_every=self.eval_every, max_epochs=self.max_epochs,
                 max_steps=self.max_steps,
                 lr=self.lr, eval_samples=self.eval_samples,
                 trajectory_steps=self.trajectory_steps, trajectory_tol=self.trajectory_tol)
        at_least("scenario.", 0, quality_tol=self.quality_tol)
        at_least("scenario.", 0, warmup_frac=self.warmup_frac)
        if self.warmup_frac >= 1:
            raise ValueError(f"scenario.warmup_frac must be below 1, got {self.warmup_frac}")
        if self.metric is not None and self.metric not in CONVERGE_METRICS:
            raise ValueError(f"scenario.metric must be one of {', '.join(CONVERGE_METRICS)}, "
                             f"got {self.metric!r}")
        if self.target is not None:
            self.target_refusal(self.metric or "loss")  # every metric's targets are above 0

    def target_refusal(self, metric: str) -> None:
        """Raise ValueError when ``target`` lies outside ``metric``'s range."""
        low, high = CONVERGE_METRICS[metric]
        if self.target is not None and not low < float(self.target) <= high:
            raise ValueError(f"scenario.target={self.target} is outside {metric}'s range "
                             f"({low:g}, {high:g}]")


def refusal(options: ConvergeOptions, family: Any, batch_size: Optional[int]) -> Optional[str]:
    """A metric this kind of model has no figure for, or a target outside the metric's range
    (the family's default metric when none is set), one line, before any work."""
    takes = family.converge_metrics
    if options.metric is not None and options.metric not in takes:
        return (f"scenario.metric={options.metric} has no figure for model family "
                f"{family.name!r} (it takes {', '.join(takes)})")
    try:
        options.target_refusal(options.metric or takes[0])
    except ValueError as e:
        return str(e)
    return None


# the metrics only scenario=converge logs (docs/contract.md's Metrics tables; fxtrack.metrics)
METRICS = (
Metric("time_to_target_s", "s", LOWER,
           "training time to the first evaluation meeting the target"),
    Metric("steps_to_target", "steps", LOWER, "optimiser steps to that evaluation"),
    Metric("samples_to_target", "samples", LOWER, "training samples to that evaluation"),
    Metric("reached_target", "0 or 1", HIGHER, "1 when the target was met within the budget"),
    Metric("eval_time_s", "s", NEITHER, "time spent evaluating, kept out of the training time"),
    Metric("train_time_s", "s", NEITHER, "training time of the whole run, compilation excluded"),
    Metric("steps_trained", "steps", NEITHER, "optimiser steps the run took"),
    Metric("loss_divergence_max", "ratio", LOWER,
       "largest relative gap of the first training losses from the first framework's"),
    Metric("final_eval_vs_fp32", "metric units", HIGHER,
       "a lever's final metric against its framework's fp32 run, positive is better"),
    Metric("time_to_target_x_fp32", "ratio", LOWER,
       "a lever's time to target / its framework's fp32 run's"),
    Metric("final_eval_accuracy", "fraction", HIGHER, "the last evaluation's accuracy"),
    Metric("final_eval_loss", "nats", LOWER, "the last evaluation's cross-entropy"),
    Metric("final_eval_bits_per_byte", "bits/byte", LOWER, "the last evaluation's bits per byte"),
)


SPEC = register(Scenario(
    "converge", "training on real data to a held-out target: time, steps and samples to it",
    ConvergeOptions, __name__, own_metrics=METRICS,
    parts=("runner", "check", "section"), refusal=refusal,
    needs=("converge",), devices_need="converge_devices", real_data=True, mfu=False,
    objectives=(
        # on real data (MLPerf Training's rule: a verdict from 5 seeds, fastest and slowest dropped)
        Objective("quality", "Time to quality", ("time_to_target_s",), "common",
                  ("reaches its target on", "the time of"),
                  (MEASURE % "converge").replace("repeats=3", "data=mnist repeats=5"), rank=10,
                  fraction=True, repeats_rule="middle"),)))
