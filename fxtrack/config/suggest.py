"""Every command fxtrack suggests passes the checks a run passes before it is shown (issue 58):
the page's commands for objectives with no figure, ``claims --plan``. A line is composed as the
CLI composes it (every cell of a sweep) and validated (keys, values, the refusal rules, the
data's shape, memory), and its frameworks and runtimes must be installed here; a line that
would fail is shown commented with the reason, never as if it would run."""

from __future__ import annotations

import functools
import itertools
import shlex
from typing import Optional

PREFIX = ("python", "-m", "fxtrack")


@functools.lru_cache(maxsize=256)
def refusal(line: str) -> Optional[str]:
    """Why ``line`` (``python -m fxtrack [-m] key=value ...``) would fail here, or None."""
    from fxtrack.config.frameworks import installed
    from fxtrack.config.validate import ConfigError, validate

    words = shlex.split(line)
    if tuple(words[:3]) != PREFIX:
        return f"not an fxtrack command: {line}"
    sweep = "-m" in words[3:]
    # a value the user fills in (``hardware.price_per_hour=<price>``) is checked as a number
    pairs = [[k, "1" if v.startswith("<") and v.endswith(">") else v]
             for k, v in (w.split("=", 1) for w in words[3:] if w != "-m" and "=" in w)]
    if len(pairs) != len([w for w in words[3:] if w != "-m"]):
        return f"not key=value: {line}"
    for cell in itertools.product(*[v.split(",") if sweep else [v] for _, v in pairs]):
        overrides = [f"{k}={v}" for (k, _), v in zip(pairs, cell)]
        settings = dict(zip((k for k, _ in pairs), cell))
        fw = settings.get("framework", "torch")
        if fw not in installed():
            return f"framework={fw} is not installed here"
        try:
            validate(_compose(overrides), sweep=sweep)
        except ConfigError as e:
            return f"{' '.join(overrides)}: {e}"
        except Exception as e:  # noqa: BLE001 - Hydra's composition errors (an unknown option)
            return f"{' '.join(overrides)}: {str(e).splitlines()[0]}"
    return None


def checked(line: str) -> str:
    """``line`` as fxtrack shows it: as is where it would run, else commented with the reason."""
    why = refusal(line)
    return line if why is None else f"# fails here ({why}): {line}"


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from fxtrack.config import register
    from fxtrack.paths import CONF_DIR

    register()
    if GlobalHydra.instance().is_initialized():  # inside a running fxtrack: its own Hydra
        return compose(config_name="config", overrides=overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)
