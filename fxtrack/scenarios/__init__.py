"""Scenarios: what is run and measured (train, inference, ...), framework-neutral. The registry
(``SCENARIOS``, name -> ``Scenario``) declares each once (``fxtrack.scenarios.declared``)."""

from fxtrack.scenarios.registry import (
    SCENARIOS,
    Objective,
    Scenario,
    get,
    names,
    objectives,
    of_section,
    options_of,
    options_set,
    register,
    unregister,
    where,
)
from fxtrack.scenarios import declared as _declared  # noqa: F401 - registers fxtrack's own

__all__ = ["SCENARIOS", "Objective", "Scenario", "get", "names", "objectives", "of_section", "options_of", "options_set", "register", "unregister",
           "where"]
