"""Shared test helpers: tiny architectures and JobSpecs for backend unit tests."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from fxtrack import architectures
from fxtrack.job import JobSpec

BACKENDS = {
    "torch": "fxtrack.frameworks.torch.backend.TorchBackend",
    "tensorflow": "fxtrack.frameworks.tensorflow.backend.TensorFlowBackend",
    "jax": "fxtrack.frameworks.jax.backend.JaxBackend",
}


def tiny_arch(name: str, **overrides) -> architectures.Arch:
    return architectures.resolve(name, "tiny", **overrides)


def job_spec(framework: str, model: str, tmp_path: Path | None = None, size: str = "tiny",
             **overrides) -> JobSpec:
    """A JobSpec as the orchestrator would write it, for running a Backend in-process."""
    arch_overrides = overrides.pop("arch", {})
    fields = dict(
        result_id=uuid.uuid4().hex, framework=framework, backend=BACKENDS[framework],
        extra=framework, scenario="train", runner="fxtrack.scenarios.train.run",
        arch=architectures.resolve(model, size, **arch_overrides).to_json(), precision="fp32",
        hardware="cpu", devices=1, compile=False, seed=0, batch_size=2, steps=3, warmup_steps=1,
        result_path=str((tmp_path or Path(".")) / "result.json"), progress=False,
    )
    fields.update(overrides)
    # A test's compile=True/False is a forced choice, not framework.compile=auto.
    fields.setdefault("compile_request", "true" if fields["compile"] else "false")
    return JobSpec(**fields)


@pytest.fixture
def spec_factory(tmp_path):
    return lambda framework, model, **kw: job_spec(framework, model, tmp_path, **kw)
