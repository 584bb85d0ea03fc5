"""Where fxtrack's own files are: its config directory and the user's config directories. A base
module (no fxtrack import), so that the CLI, the config layer and calibration find conf/ one way."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

CONFIG_DIR_ENV = "FXTRACK_CONFIG_DIR"  # the user's own config dirs (os.pathsep-separated)


def conf_dir() -> Path:
    """fxtrack's config directory: in a checkout (editable install, or a source tree on
    PYTHONPATH) the checkout's own ``conf/`` beside this package; in an installed wheel the
    package ``fxtrack.conf`` (setup.py maps the checkout's ``conf/`` onto it)."""
    checkout = Path(__file__).resolve().parent.parent / "conf"
    if (checkout / "config.yaml").is_file():
        return checkout
    spec = importlib.util.find_spec("fxtrack.conf")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return checkout


CONF_DIR = conf_dir()


def user_config_dirs() -> list[Path]:
    """The directories named by $FXTRACK_CONFIG_DIR, made absolute."""
    return [Path(d).resolve() for d in os.environ.get(CONFIG_DIR_ENV, "").split(os.pathsep) if d]


def config_dirs() -> list[Path]:
    """fxtrack's config directory, then the user's: where group options (framework/*.yaml) live."""
    return [CONF_DIR, *user_config_dirs()]
