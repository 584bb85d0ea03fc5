"""Everything that talks to MLflow lives here (and only here imports ``mlflow``)."""
