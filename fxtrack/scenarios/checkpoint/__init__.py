"""scenario=checkpoint: saving, restoring and exporting the training state (its runner)."""

from __future__ import annotations

import dataclasses

from fxtrack.scenarios.options import Options
from fxtrack.scenarios.registry import Scenario, register


@dataclasses.dataclass
class CheckpointOptions(Options):
    name: str = "checkpoint"


SPEC = register(Scenario(
    "checkpoint", "saving, restoring and exporting the training state",
    CheckpointOptions, __name__, mfu=False))
