"""model.from_run=<run id>: scenario=inference on a converge run's trained weights. Before any
work the run is looked up (fxtrack.tracking.models) and its model dims, size and data config
replace the command line's, so validation rebuilds the family at the run's shapes on the same
held-out split; bad input is one ConfigError line. Job.run then fetches the weights for the
worker (``JobSpec.from_run``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from fxtrack import architectures, scenarios
from fxtrack.config.validate import ConfigError

_CACHE: dict[tuple[str, str], dict[str, Any]] = {}  # (uri, run id) -> the run: a sweep's jobs


def run_id(cfg: Any) -> str | None:
    model = cfg.model
    return model.get("from_run") if isinstance(model, DictConfig) else getattr(model, "from_run",
                                                                               None)


def apply(cfg: DictConfig, uri: str) -> None:
    """Put the run's model and data into ``cfg`` (nothing when model.from_run is unset);
    ConfigError for a run that is not there, keeps no weights, or trained another family, and
    for a scenario or precision that does not evaluate it."""
    wanted = run_id(cfg)
    if not wanted:
        return
    # only now: MLflow's import (about 0.8 s) on every job's path delayed its worker's start
    from fxtrack.tracking import models

    readers = scenarios.where(from_run=True)
    if cfg.scenario.name not in readers:
        raise ConfigError(f"model.from_run is read by scenario={'/'.join(readers)} (it "
                          f"evaluates the run's model on the held-out split); scenario="
                          f"{cfg.scenario.name} builds seeded weights: drop model.from_run")
    if cfg.precision.name != "fp32":
        raise ConfigError("model.from_run evaluates at precision=fp32, the reference "
                          "accuracy_vs_fp32 is taken against; use quantize=dynamic_int8 or a "
                          f"runtime for the serving precision, not precision={cfg.precision.name}")
    key = (uri, str(wanted))
    if key not in _CACHE:
        try:
            _CACHE[key] = models.source(uri, str(wanted))
        except models.NoModel as e:
            raise ConfigError(str(e)) from None
    found = _CACHE[key]
    params = found["params"]
    theirs = params.get("model.name", "?")
    if architectures.spec(theirs) is None or \
            architectures.family(theirs) != architectures.family(cfg.model.name):
        raise ConfigError(f"model.from_run={wanted} trained model={theirs}, another family than "
                          f"model={cfg.model.name}: use model={theirs}")
    with open_dict(cfg):
        cfg.model.name = theirs
        cfg.size.name = params.get("size.name", cfg.size.name)
        for key_ in list(cfg.model.keys()):
            if f"model.{key_}" in params and key_ not in ("name", "from_run"):
                cfg.model[key_] = int(params[f"model.{key_}"])
        for key_ in list(cfg.data.keys()):
            if f"data.{key_}" in params:
                value = params[f"data.{key_}"]
                cfg.data[key_] = float(value) if key_ == "holdout" else value


def spec_of(cfg: Any, uri: str, job_dir: Path) -> dict[str, Any]:
    """``JobSpec.from_run`` for a config ``apply`` checked: the weights fetched into the job's
    directory and the evaluation's size (the run's ``scenario.eval_samples``)."""
    wanted = run_id(cfg)
    if not wanted:
        return {}
    from fxtrack.tracking import models  # only now, as in apply

    key = (uri, str(wanted))
    found = _CACHE.get(key) or _CACHE.setdefault(key, models.source(uri, str(wanted)))
    weights = models.fetch(uri, found, job_dir / "from_run")
    return {"run_id": str(wanted), "weights": str(weights),
            "eval_samples": int(found["params"].get("scenario.eval_samples", 0)) or None}
