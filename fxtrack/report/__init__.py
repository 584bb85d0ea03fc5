"""``fxtrack report``: comparison tables and charts from the runs logged to MLflow.

The flow is MLflow -> ``fxtrack.tracking.reader`` (a DataFrame of runs) -> ``select`` (the latest
finished run per benchmark) -> ``tables`` / ``charts`` -> ``render`` (terminal, Markdown, HTML,
CSV). Nothing here imports mlflow; only ``cli`` reaches into ``fxtrack.tracking``.
"""

import logging

# matplotlib's first import logs "generated new fontManager" at INFO, which Hydra's job logging
# (a sweep's closing report) prints as "[HYDRA] ...": library noise, not the user's business.
logging.getLogger("matplotlib").setLevel(logging.WARNING)
