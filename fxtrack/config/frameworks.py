"""The frameworks fxtrack's configs declare: every ``framework/*.yaml`` in the config directories
(fxtrack's own, then ``$FXTRACK_CONFIG_DIR``'s), its ``package`` -> that package's declaration
(``fxtrack.frameworks.declaration.Framework``). Imports no framework: a declaration never does.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from fxtrack.frameworks.declaration import Framework, declaration
from fxtrack.paths import config_dirs


def declared() -> dict[str, Framework]:
    """Framework name -> declaration, in report order (``report_order``, then name)."""
    return dict(_declared(tuple(config_dirs())))


def identity_settings() -> tuple[str, ...]:
    """The framework settings that are part of a run's identity (``Setting.identity``, e.g.
    Keras's ``keras_backend``), in report order: each is the run's ``fxtrack.<key>`` tag and
    ``framework.<key>`` param; the report keeps runs apart by it and shows it with the
    framework (``keras-jax``, ``keras[jax]``)."""
    keys: list[str] = []
    for framework in declared().values():
        keys += [k for k, s in framework.settings.items() if s.identity and k not in keys]
    return tuple(keys)


def packages() -> dict[str, str]:
    """Framework name -> the package its YAML names. Where two config directories hold the same
    name, the first wins, as in Hydra's search path; a YAML without ``package`` is skipped."""
    return dict(_packages(tuple(config_dirs())))


@functools.lru_cache(maxsize=None)
def _packages(dirs: tuple[Path, ...]) -> tuple[tuple[str, str], ...]:
    from omegaconf import OmegaConf  # the orchestrator's dependency, not the worker's

    found: dict[str, str] = {}
    for root in dirs:
        for path in sorted((root / "framework").glob("*.yaml")):
            package = OmegaConf.load(path).get("package")
            if package is not None and path.stem not in found:
                found[path.stem] = package
    return tuple(found.items())


@functools.lru_cache(maxsize=None)
def _declared(dirs: tuple[Path, ...]) -> tuple[tuple[str, Framework], ...]:
    found: dict[str, Framework] = {}
    for name, package in _packages(dirs):
        try:
            found[name] = declaration(package)
        except (ImportError, ValueError) as e:
            raise ValueError(f"framework/{name}.yaml: package {package!r} declares no "
                             f"framework ({e})") from e
    return tuple(sorted(found.items(), key=lambda item: (item[1].report_order, item[0])))


def installed() -> tuple[str, ...]:
    """The declared frameworks whose own package this interpreter finds (found, not imported:
    a suggestion names only what can run here). A framework in another venv
    (``framework.python``) is not seen."""
    return tuple(name for name in declared() if importlib.util.find_spec(name) is not None)
