"""The commands that would measure a published claim (``fxtrack claims --plan``): real
``python -m fxtrack ...`` lines with the config keys of its arms and conditions, commented out,
saying what they need, where this machine or install cannot run them."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from fxtrack.config.frameworks import identity_settings
from fxtrack.measure import peak
from fxtrack.report.identity import LEVERS

# Arm keys -> the config key a command sets (the identity columns of
# samples.configs have the arm keys' names).
def config_keys() -> dict[str, str]:
    """Arm keys -> the config key a command sets (read at each call: a framework's identity
    settings come from its declaration)."""
    return {"framework": "framework",
            **{key: f"framework.{key}" for key in identity_settings()},
            "compile": "framework.compile", "precision": "precision", "devices": "devices",
            "batch_size": "batch_size", **{lever: lever for lever in LEVERS}}
REPEATS = 3  # what a plan asks for: the fewest repeats that give a usable interval


def machine_kind() -> str:
    """``gpu`` where an NVIDIA driver is installed, else ``cpu`` (no framework is imported)."""
    return "gpu" if shutil.which("nvidia-smi") or Path("/proc/driver/nvidia").exists() else "cpu"


def plan(claim: Any, machine: str) -> list[str]:  # a fxtrack.report.claims.Claim
    """``python -m fxtrack ...`` lines that measure the claim's arms (a comment says when one
    needs hardware or a framework this machine or install lacks)."""
    cond = claim.conditions
    # a ratio checked anywhere is measured here; a figure for the claimed hardware, there
    hardware = (cond.get("hardware") if claim.test == "on_device" else None) or machine
    fixed = {"model": cond.get("model"), "scenario": cond.get("scenario")}
    for key in ("precision", "batch_size", "devices"):
        if key not in claim.arm_keys and cond.get(key) is not None and not (key == "devices" and cond[key] == 1):
            fixed[key] = cond[key]
    fixed.update(hardware=hardware, repeats=REPEATS)
    sets = [{config_keys()[k]: str(v).lower() if k == "compile" else str(v)
             for k, v in arm.items() if k != "value"} for arm in claim.arms]
    lines = [_line(fixed, sweep, machine) for sweep in _sweeps(sets)]
    if hardware != machine and claim.kind in ("absolute", "memory"):
        # the arms' ratios to one another are measurable here, though not the figures
        lines.append("# the ratio form on this machine:")
        lines += [_line(dict(fixed, hardware=machine), sweep, machine) for sweep in _sweeps(sets)]
    return lines


def _sweeps(sets: list[dict[str, str]]) -> list[dict[str, list[str]]]:
    """Arms as few sweeps as possible: arms that differ in one key only become one sweep over it."""
    if len({frozenset(s) for s in sets}) == 1:
        differ = [k for k in sets[0] if len({s[k] for s in sets}) > 1]
        if len(differ) <= 1:
            return [{k: list(dict.fromkeys(s[k] for s in sets)) for k in sets[0]}]
    by_rest: dict[tuple, list[str]] = {}
    for s in sets:
        rest = tuple(sorted((k, v) for k, v in s.items() if k != "framework"))
        by_rest.setdefault(rest, []).append(s.get("framework", ""))
    return [{**{k: [v] for k, v in rest}, **({"framework": [f for f in fws if f]} if any(fws) else {})}
            for rest, fws in by_rest.items()]


def _too_large(values: dict[str, list[str]], machine: str) -> bool:
    """Whether the memory check refuses the line's model at full size on this machine."""
    from fxtrack import architectures
    from fxtrack.config import memory

    if values.get("hardware") != [machine]:
        return False  # another machine's line: its own check runs there
    try:
        arch = architectures.resolve(values["model"][0], "full")
    except (KeyError, ValueError, IndexError):
        return False
    batch = int(values["batch_size"][0]) if values.get("batch_size", [""])[0].isdigit() else None
    precision = values.get("precision", ["fp32"])[0]
    return memory.refusal(arch, values.get("scenario", ["train"])[0], precision, batch,
                          machine) is not None


def _line(fixed: dict[str, Any], sweep: dict[str, list[str]], machine: str) -> str:
    """One command line; commented out, saying why, when this machine or install cannot run it."""
    values = {k: [str(v)] for k, v in fixed.items() if v is not None}
    values.update(sweep)
    order = ["framework", *(f"framework.{k}" for k in identity_settings()), "framework.compile",
             "model", "scenario",
             "precision", "runtime", "quantize", "parallel", "memory", "batch_size", "devices",
             "hardware", "repeats"]
    args = [f"{k}={','.join(values[k])}" for k in order if k in values]
    multirun = any(len(v) > 1 for v in values.values())
    line = "python -m fxtrack " + ("-m " if multirun else "") + " ".join(args)
    needs = ["a GPU"] if values["hardware"] == ["gpu"] and machine != "gpu" else []
    if values["hardware"] == ["cpu"]:  # tf32 is a GPU's tensor-core format; fp16 only some CPUs do
        lacking = [p for p in values.get("precision", []) if p in ("tf32", "fp16")
                   and peak.native_precision(p, "cpu") is not True]
        if lacking:
            needs.append(f"hardware with precision={','.join(lacking)} (this CPU computes it as "
                         "fp32 or emulates it)")
    if _too_large(values, machine):
        needs.append("more memory than this machine has (the memory check refuses the full "
                     "size here; size=tiny runs but does not test the claim)")
    from fxtrack.config.frameworks import installed

    missing = [fw for fw in values.get("framework", []) if fw not in installed()]
    if missing:
        needs.append(f"framework={','.join(missing)} (not in this install)")
    if needs:
        return f"# needs {' and '.join(needs)}: {line}"
    from fxtrack.config.suggest import checked

    return checked(line)  # validated as a run is: a line that would fail is commented
