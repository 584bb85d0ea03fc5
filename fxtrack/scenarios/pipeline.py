"""The input-pipeline scenario: each framework's idiomatic loader reading the on-disk synthetic
dataset (fxtrack.datasets), measured alone and feeding training, against training on
device-resident data.

``pipeline_samples_per_s``: the loader alone; ``throughput_samples_per_s``: training fed by the
loader; ``resident_samples_per_s``: training on the resident batch; ``input_bound_fraction`` =
1 - fed / resident (0: the loader keeps up; 0.4: training runs 40% slower because of input).
"""

from __future__ import annotations

import time

from fxtrack import datasets, flops
from fxtrack.frameworks.base import Backend
from fxtrack.job import Result
from fxtrack.measure.timer import time_steps
from fxtrack.scenarios.timed import run_timed
from fxtrack.scenarios.train import guard


def run(backend: Backend, result: Result) -> None:
    spec = backend.spec
    options = spec.options
    handles = run_timed(backend, result, lambda: backend.train_step,
                        flops.train_flops_per_sample(backend.arch))
    m = result.metrics
    resident = m["throughput_samples_per_s"]
    batch, steps, warmup = (result.resolved[k] for k in ("batch_size", "steps", "warmup_steps"))
    directory = datasets.ensure(backend.arch, options["dataset_samples"], spec.seed)
    loader = backend.pipeline_loader(directory, batch, options["loader_workers"])

    for _ in range(warmup):  # worker start-up, file-system cache, autotuning
        next(loader)
    t0 = time.perf_counter()
    for _ in range(steps):
        next(loader)
    # one draw is one step of every device on every node
    m["pipeline_samples_per_s"] = batch * spec.devices * spec.nodes * steps / (time.perf_counter() - t0)

    fed = time_steps(lambda: backend.train_step_on(next(loader)), warmup, steps,
                     show=spec.progress, label="fed by the loader")
    m["resident_samples_per_s"] = resident
    m["throughput_samples_per_s"] = batch * spec.devices * spec.nodes * steps / fed.window_s
    m["input_bound_fraction"] = max(0.0, 1.0 - m["throughput_samples_per_s"] / resident)
    m["achieved_tflops"] = m["flops_per_sample"] * m["throughput_samples_per_s"] / 1e12
    losses = [backend.loss_value(h) for h in handles]
    m.update(loss_first=losses[0], loss_last=losses[-1])
    result.guard = guard(backend, int(m["param_count"]), losses)
