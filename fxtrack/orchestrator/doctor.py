"""``fxtrack doctor``: what is installed, what each framework sees, and what fxtrack will use."""

from __future__ import annotations

import argparse
import os
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from fxtrack.environment import host_tags, redact_uri_text
from fxtrack.measure import peak, tuned
from fxtrack.orchestrator import calibration


def nvml_state() -> tuple[Optional[int], str]:
    """(GPU count or None, one line) from NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                     for i in range(count)]
            driver = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # noqa: BLE001 - no library, no driver: say so
        return None, f"unavailable ({type(e).__name__}: {e}); no GPU energy or NVML memory figures"
    return count, f"driver {driver}, {count} GPU(s): {', '.join(map(str, names)) or '-'}"


def tracking_state(uri: str) -> str:
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
        return f"{redact_uri_text(uri)} ({'exists' if path.exists() else 'created on the first run'})"
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=5) as r:
                return f"{redact_uri_text(uri)} (reachable, HTTP {r.status})"
        except OSError as e:
            return f"{redact_uri_text(uri)} (NOT reachable: {e}); results will be spooled for `fxtrack sync`"
    return redact_uri_text(uri)


def install_line(framework: str, missing: str) -> str:
    """Why ``framework`` cannot run: itself not installed, or a module its backend imports
    (TensorFlow's fxtrack backend needs Keras 3): "tensorflow not installed (keras missing)"
    read as if TensorFlow itself were absent."""
    fix = f"pip install 'fxtrack[{framework}]'"
    top = str(missing).split(".")[0]
    if top in (framework, "fxtrack"):
        return f"not installed ({missing} missing): {fix}"
    return f"cannot run: its fxtrack backend needs {top}, which is not installed: {fix}"


def tuned_lines() -> list[str]:
    """The cached framework.compile=tune picks that framework.compile=auto reuses."""
    picks = tuned.cached()
    lines = [f"tuned compile modes ({tuned.cache_path()}, read by framework.compile=auto):"
             + ("" if picks else " none (run with framework.compile=tune to add one)")]
    lines += [f"  {key}: compile={str(pick['compiled']).lower()} ({pick.get('figures')}, "
              f"tuned {pick.get('date', '?')})" for key, pick in sorted(picks.items())]
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fxtrack doctor", description=__doc__)
    parser.add_argument("--require", default="", help="comma-separated frameworks that must be "
                        "installed (e.g. torch,jax); exit status 1 if one is missing")
    parser.add_argument("--calibrate", action="store_true",
                        help="measure the peak FLOP/s again (fp32, bf16) and refresh the cache")
    parser.add_argument("--python", action="append", default=[], metavar="FW=PYTHON",
                        help="interpreter of a framework living in its own venv, e.g. "
                        "jax=/opt/jax/bin/python")
    args = parser.parse_args(argv)
    pythons = dict(p.split("=", 1) for p in args.python)
    required = [f for f in args.require.split(",") if f]
    frameworks = calibration.frameworks()
    unknown = [f for f in required if f not in frameworks]
    if unknown:
        parser.error(f"--require takes {', '.join(frameworks)}; got {', '.join(unknown)}")

    gpus, nvml_line = nvml_state()
    with ThreadPoolExecutor(len(frameworks)) as pool:
        answers = dict(zip(frameworks, pool.map(
            lambda fw: calibration.ask_worker("describe", fw, pythons.get(fw), timeout_s=300),
            frameworks)))
    print(f"host: {', '.join(f'{k.split(chr(46))[-1]}={v}' for k, v in host_tags().items())}")
    print(f"NVML: {nvml_line}")
    missing = []
    for fw, answer in answers.items():
        if answer is None:
            print(f"{fw:<11} ERROR: its worker failed to start (run a job with verbose=true)")
            missing.append(fw)
        elif not answer["installed"]:
            print(f"{fw:<11} {install_line(fw, answer['missing'])}")
            missing.append(fw)
        else:
            devices = answer["devices"]
            flag = ""
            if gpus and not any("cpu" not in d.lower() for d in devices):
                flag = f"  WARNING: {gpus} GPU(s) present but {fw} sees none (a CPU-only build?)"
            print(f"{fw:<11} {answer['version']:<14} devices: {', '.join(devices)}{flag}")
    from fxtrack.tracking.target import tracking_uri

    print(f"tracking: {tracking_state(tracking_uri(None, os.getcwd()))}")
    if args.calibrate:
        device = next((a["device"] for a in answers.values() if a and a.get("installed")), "cpu")
        for precision in ("fp32", "bf16"):
            calibration.calibrate(device, precision, "auto", pythons, refresh=True)
    entries = peak.cached()
    print(f"peak FLOP/s cache ({peak.cache_path()}):" + ("" if entries else " empty"))
    for key, rates in sorted(entries.items()):
        shown = ", ".join(f"{fw} {e['tflops']:.3f}" if e.get("tflops") else f"{fw} -"
                          for fw, e in rates.items())
        dates = sorted({e["date"] for e in rates.values() if e.get("date")})
        print(f"  {key}: TFLOP/s {shown}" + (f" (measured {dates[-1]})" if dates else ""))
    print("\n".join(tuned_lines()))
    absent = [f for f in required if f in missing]
    if absent:
        print(f"fxtrack doctor: required but missing: {', '.join(absent)}")
        return 1
    return 0
