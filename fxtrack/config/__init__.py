"""Structured configs: the schema of every config group, registered in Hydra's ConfigStore."""

from fxtrack.config.schema import FxtrackConfig, register

__all__ = ["FxtrackConfig", "register"]
