"""Scenarios: what is run and measured (train, inference, ...), framework-neutral. Each is one
folder here (``fxtrack/scenarios/<name>/``) whose ``__init__`` registers its spec in the registry
(``SCENARIOS``, name -> ``Scenario``); importing this package registers fxtrack's own, in the
report's order. Modules beside the folders are the worker-side helpers several share."""

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
    probe_tags,
    register,
    unregister,
    where,
    with_part,
)
# each registers itself as it is imported, in this order (the report's)
from fxtrack.scenarios import (  # noqa: E402,F401
    train,
    inference,
    generate,
    scaling,
    pipeline,
    checkpoint,
    fit,
    serve,
    converge,
)

__all__ = ["SCENARIOS", "Objective", "Scenario", "get", "names", "objectives", "of_section",
           "options_of", "options_set", "probe_tags", "register", "unregister", "where", "with_part"]
