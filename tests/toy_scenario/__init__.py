"""A toy scenario, one folder as docs/extending.md's "Adding a scenario" lists it: its options
and spec here, its worker runner, its config check and its report section beside them.
``tests/test_scenarios.py`` imports it (which registers it) and follows it through validation,
the worker, ``--help``, the report, the answer page and the contract check."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from fxtrack.metrics import HIGHER, NEITHER, Metric
from fxtrack.scenarios.options import Options, positive
from fxtrack.scenarios.registry import Objective, Scenario, register


@dataclasses.dataclass
class ToyOptions(Options):
    name: str = "toy"
    widgets: int = 3  # how many steps the runner takes
    gain: float = 1.0  # a float option: NaN and inf must be refused

    def __post_init__(self) -> None:
        positive("scenario.", widgets=self.widgets, gain=self.gain)


def refusal(options: ToyOptions, family: Any, batch_size: Optional[int]) -> Optional[str]:
    return "scenario=toy takes no model=llama" if family.generates else None


METRICS = (  # the metrics only scenario=toy logs
    Metric("toy_widgets", "widgets", HIGHER, "widgets made per step"),
    Metric("toy_loss", "loss", NEITHER, "the toy model's last loss"),
)


SPEC = register(Scenario(
    "toy", "widgets made per step (a test's toy)", ToyOptions, __name__, own_metrics=METRICS,
    parts=("runner", "check", "section"), refusal=refusal, objectives=(
        Objective("widgets", "Widgets per step", ("toy_widgets",), "common",
                  ("makes", "as many widgets of"),
                  "python -m fxtrack -m framework={frameworks} model={model} scenario=toy",
                  rank=15),)))
