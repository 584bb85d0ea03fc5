"""scenario=checkpoint: saving, restoring and exporting the training state (its runner)."""

from __future__ import annotations

import dataclasses

from fxtrack.metrics import HIGHER, LOWER, NEITHER, Metric
from fxtrack.scenarios.options import Options
from fxtrack.scenarios.registry import Scenario, register


@dataclasses.dataclass
class CheckpointOptions(Options):
    name: str = "checkpoint"


# the metrics only scenario=checkpoint logs (docs/contract.md's Metrics tables; fxtrack.metrics)
METRICS = (
    Metric("checkpoint_save_s", "s", LOWER, "saving the full training state"),
    Metric("checkpoint_restore_s", "s", LOWER, "restoring it"),
    Metric("checkpoint_mib", "MiB", LOWER, "the checkpoint on disk"),
Metric("checkpoint_restore_exact", "0 or 1", HIGHER,
           "1: the restore replayed the step exactly"),
    Metric("loss_next_step", "loss", NEITHER, "the next step's loss before saving"),
    Metric("loss_after_restore", "loss", NEITHER, "the same step's loss after restoring"),
    Metric("export_s", "s", LOWER, "exporting the model for serving"),
    Metric("export_mib", "MiB", LOWER, "the exported model on disk"),
    Metric("{live|export}_latency_ms_p50", "ms", LOWER, "median forward time, live and exported"),
    Metric("export_latency_ratio", "ratio", LOWER, "exported / live forward time"),
    Metric("export_max_rel_err", "ratio", LOWER, "the export's largest relative error"),
)


SPEC = register(Scenario(
    "checkpoint", "saving, restoring and exporting the training state",
    CheckpointOptions, __name__, own_metrics=METRICS, mfu=False))
