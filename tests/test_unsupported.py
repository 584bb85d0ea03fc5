"""A combination a framework has no path for (NotSupported in the worker) is a "not
supported" cell: tagged, shown as such in a sweep's closing table, and not counted as a failure."""

from __future__ import annotations

from conftest import job_spec

from fxtrack.frameworks.base import Backend
from fxtrack.frameworks.declaration import NotSupported
from fxtrack.orchestrator.sweep import _unsupported, closing_table
from fxtrack.worker.__main__ import run


class NoPathBackend(Backend):
    """Stands in for a framework: builds nothing, has no path for the scenario."""
    name = "nopath"

    def version(self): return "0"
    def device_kind(self): return "cpu"
    def build(self, batch_size): pass
    def param_count(self): return 0
    def train_step(self): return None
    def loss_value(self, handle): return 0.0


def no_path(backend, result):
    raise NotSupported("parallel=fsdp is not supported by nopath 0: use parallel=ddp")


def crash(backend, result):
    raise RuntimeError("out of cheese")


def not_implemented(backend, result):
    raise NotImplementedError("half-written")


def test_not_supported_is_tagged_unsupported_and_other_errors_are_not(tmp_path, monkeypatch):
    import dataclasses

    from fxtrack.frameworks import torch as torch_package

    monkeypatch.setattr(torch_package, "FRAMEWORK", dataclasses.replace(
        torch_package.FRAMEWORK, backend="test_unsupported:NoPathBackend"))
    spec = job_spec("torch", "vit", tmp_path, runner="test_unsupported:no_path")
    result = run(spec)
    assert result.status == "FAILED" and result.tags["unsupported"] == "true"
    assert "not supported by nopath" in result.error
    spec.runner = "test_unsupported:crash"
    assert "unsupported" not in run(spec).tags
    spec.runner = "test_unsupported:not_implemented"  # a bug, not a declared absence
    assert "unsupported" not in run(spec).tags


def test_closing_table_shows_not_supported_cells():
    jobs = [{"name": "torch-vit", "status": "FINISHED", "guard": "ok", "error": None,
             "metrics": {"throughput_samples_per_s": 3.0}, "tags": {}},
            {"name": "tensorflow-vit", "status": "FAILED", "guard": "ok",
             "error": "NotSupported: not supported by tensorflow", "metrics": {},
             "tags": {"fxtrack.unsupported": "true"}}]
    assert [_unsupported(j) for j in jobs] == [False, True]
    table = closing_table(jobs)
    assert "tensorflow-vit  NOT SUPPORTED" in table and "torch-vit       FINISHED" in table
