"""The frameworks fxtrack's configs declare: every ``framework/*.yaml`` in the config directories
(fxtrack's own, then ``$FXTRACK_CONFIG_DIR``'s), its ``package`` -> that package's declaration
(``fxtrack.frameworks.declaration.Framework``). Imports no framework: a declaration never does.
"""

from __future__ import annotations

import functools
from pathlib import Path

from fxtrack.frameworks.declaration import Framework, declaration
from fxtrack.paths import config_dirs


def declared() -> dict[str, Framework]:
    """Framework name -> declaration, in report order (``report_order``, then name). Where two
    config directories hold the same name, the first wins, as in Hydra's search path."""
    return dict(_declared(tuple(config_dirs())))


@functools.lru_cache(maxsize=None)
def _declared(dirs: tuple[Path, ...]) -> tuple[tuple[str, Framework], ...]:
    from omegaconf import OmegaConf  # the orchestrator's dependency, not the worker's

    found: dict[str, Framework] = {}
    for root in dirs:
        for path in sorted((root / "framework").glob("*.yaml")):
            package = OmegaConf.load(path).get("package")
            if package is None or path.stem in found:  # no declaration to read; or shadowed
                continue
            try:
                found[path.stem] = declaration(package)
            except (ImportError, ValueError) as e:
                raise ValueError(f"{path}: package {package!r} declares no framework ({e})") from e
    return tuple(sorted(found.items(), key=lambda item: (item[1].report_order, item[0])))
