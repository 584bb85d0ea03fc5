"""scenario=train: training steps on synthetic data, timed (its runner)."""

from __future__ import annotations

import dataclasses

from fxtrack.metrics import NEITHER, Metric
from fxtrack.scenarios.options import Options, apart, at_least
from fxtrack.scenarios.registry import MEASURE, Objective, Scenario, register


@dataclasses.dataclass
class TrainOptions(Options):
    name: str = "train"
    # after the timed window: this many steps under the framework's own profiler, their time
    # split into categories (the profile_* metrics); 0: none.
    profile_steps: int = apart("profiled after the timed window: the figures are measured "
                               "before it", default=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least("scenario.", 0, profile_steps=self.profile_steps)


# the metrics only scenario=train logs (docs/contract.md's Metrics tables; fxtrack.metrics)
METRICS = (
    Metric("profile_{matmul|attention|norm_elementwise|optimizer|overhead}_ms", "ms", NEITHER,
       "scenario.profile_steps: one profiled step's time in that category (its framework's own "
       "profiler)"),
Metric("profile_step_ms", "ms", NEITHER,
           "scenario.profile_steps: the profiled step's wall span"),
    Metric("profile_timed_step_ms", "ms", NEITHER, "scenario.profile_steps: the median profiled "
       "step as fxtrack's timer saw it, around the step annotation"),
    Metric("profile_unprofiled_step_ms", "ms", NEITHER, "scenario.profile_steps: the median "
       "unprofiled step timed just before and just after the profiled ones"),
)


SPEC = register(Scenario(
    "train", "training steps on synthetic data: throughput, step time, memory, MFU",
    TrainOptions, __name__, own_metrics=METRICS, option_needs=(("profile_steps", "profile"),),
    objectives=(
        Objective("train", "Training throughput", ("throughput_samples_per_s",), "common",
                  ("trains", "as fast as"), MEASURE % "train", rank=0),
        Objective("memory", "Peak memory at equal batch", ("peak_mem_device_mib", "peak_rss_mib"),
                  "common", ("trains", "the peak memory of"), MEASURE % "train", rank=70,
                  fraction=True),
        Objective("cost", "Cost per 1M samples", ("cost_per_1m_samples",), "common",
                  ("trains", "cheaper than"),
                  MEASURE % "train" + " hardware.price_per_hour=<price>", rank=80),
        # the compile time first, as the run's own line and docs/reading-the-answer.md say it
        Objective("compile", "Compile / first-step time", ("compile_time_s", "first_step_time_s"),
                  "common", ("starts training", "faster than"), MEASURE % "train", rank=90))))
