"""The worker process: ``python -m fxtrack.worker SPEC.json`` runs one job and writes its Result.

It imports only the job's own framework and needs neither Hydra nor MLflow, so it runs under any
interpreter whose environment holds that framework (``framework.python``).
"""
