"""Accuracy at serving precision (``scenario=inference model.from_run=<run id>``): a converge
run's trained weights (``JobSpec.from_run``, fetched by the orchestrator) loaded into the built
model in place of the seeded start, then the held-out split the run evaluated on scored twice
in the same job: by the native fp32 model (the reference) and by what the run serves (the
runtime's artefact, or the quantised model; the native model itself for runtime=native
quantize=none). ``eval_accuracy`` is the served figure, ``accuracy_vs_fp32`` its ratio to the
reference, and the ``serving_quality`` tag says ``lost`` below MLPerf Inference's bar
(``fxtrack.metrics.SERVING_QUALITY``: 99% of the fp32 reference), else ``kept``."""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from fxtrack import data, families
from fxtrack.frameworks.base import Backend
from fxtrack.worker.protocol import Result
from fxtrack.measure.timer import eprint
from fxtrack.metrics import SERVING_QUALITY
from fxtrack.scenarios.converge import runner as converge


def load(backend: Backend) -> None:
    """The run's weights into the built model (before the timed window and any export)."""
    backend.capability("converge").load_weights(backend, backend.spec.from_run["weights"])


def evaluate(backend: Backend, result: Result,
             served: Optional[Callable[[dict[str, np.ndarray]], list[Any]]] = None,
             like: Optional[dict[str, np.ndarray]] = None) -> None:
    """Score the held-out split (the first ``eval_samples`` of it, as the run did) with the
    native model and, given ``served`` (a runtime's callable on the exported inputs by name,
    ``like``: the reference's, one input of the built batch size), with it too; fill the
    metrics and tag."""
    spec = backend.spec
    trainer = backend.capability("converge")
    split = data.load(spec.data)
    seq_len = int(spec.arch["dims"].get("seq_len", 1))
    n_held = data.samples(split, seq_len, held=True)
    held = list(range(min(spec.from_run.get("eval_samples") or n_held, n_held)))
    batch = int(result.resolved["batch_size"])
    totals = {"fp32": 0.0, "served": 0.0}
    count = 0
    for start in range(0, len(held), batch):
        rows = held[start:start + batch]
        # an export is built for one batch shape: the last part padded, its extra rows dropped
        part = data.batch(split, rows + rows[-1:] * (batch - len(rows)), seq_len, held=True,
                          family=families.of(spec.arch))
        labels, weights = (None if t is None else t[:len(rows)] for t in data.targets(part))
        ref = trainer.outputs(backend, part)[:len(rows)]
        figure, n = converge.score("accuracy", ref, labels, weights)
        totals["fp32"] += figure
        count += n
        if served is not None:
            (name, first), = like.items()  # fxtrack's own models take one input
            x = trainer.exported_input(backend, part).astype(first.dtype)
            out = np.asarray(served({name: x})[0], np.float32)[:len(rows)].reshape(ref.shape)
            totals["served"] += converge.score("accuracy", out, labels, weights)[0]
    fp32 = totals["fp32"] / count
    accuracy = totals["served"] / count if served is not None else fp32
    ratio = accuracy / fp32 if fp32 > 0 else float("nan")
    result.metrics.update(eval_accuracy=accuracy, accuracy_vs_fp32=ratio)
    result.tags["serving_quality"] = "kept" if ratio >= SERVING_QUALITY else "lost"
    result.resolved["dataset"] = converge.dataset_record(split, spec.data)
    eprint(f"[fxtrack] model.from_run={spec.from_run['run_id']}: held-out accuracy "
           f"{accuracy:.4f} ({spec.runtime}/{spec.quantize}), fp32 {fp32:.4f}, ratio {ratio:.4f}")
