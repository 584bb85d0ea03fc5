"""scenario=pipeline: each framework's input pipeline from files on disk (its runner)."""

from __future__ import annotations

import dataclasses

from fxtrack.scenarios.options import Options, at_least, positive
from fxtrack.scenarios.registry import Scenario, register


@dataclasses.dataclass
class PipelineOptions(Options):
    name: str = "pipeline"
    dataset_samples: int = 512  # samples in the on-disk synthetic dataset ($FXTRACK_CACHE)
    loader_workers: int = 2  # loader processes / parallel calls

    def __post_init__(self) -> None:
        super().__post_init__()
        positive("scenario.", dataset_samples=self.dataset_samples)
        at_least("scenario.", 0, loader_workers=self.loader_workers)


SPEC = register(Scenario(
    "pipeline", "each framework's input pipeline from files on disk, then training on it",
    PipelineOptions, __name__, needs=("pipeline",), reads_files=True))
