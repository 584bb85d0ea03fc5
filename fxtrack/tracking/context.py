"""The ``mlflow.run_context_provider`` plugin: fxtrack's hardware/software tags on every fluent
MLflow run where fxtrack is installed. Loading it imports no framework and no NVML; it never
raises (a fact it cannot read is left out)."""

from __future__ import annotations

from mlflow.tracking.context.abstract_context import RunContextProvider

from fxtrack.environment import host_tags


class FxtrackRunContext(RunContextProvider):
    def in_context(self) -> bool:
        return True

    def tags(self) -> dict[str, str]:
        try:
            return dict(host_tags())
        except Exception:  # noqa: BLE001 - a plugin must never break the user's run
            return {}
