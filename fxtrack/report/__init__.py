"""``fxtrack report``: comparison tables and charts from the runs logged to MLflow.

The flow is MLflow -> ``fxtrack.tracking.reader`` (a DataFrame of runs) -> ``select`` (the latest
finished run per benchmark) -> ``tables`` / ``charts`` -> ``render`` (terminal, Markdown, HTML,
CSV). Nothing here imports mlflow; only ``cli`` reaches into ``fxtrack.tracking``.
"""
