"""``fxtrack`` / ``python -m fxtrack``: the Hydra app, plus the sub-commands report, doctor, sync."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import textwrap
import sys
from pathlib import Path
from typing import Any

from fxtrack.paths import CONF_DIR, CONFIG_DIR_ENV, user_config_dirs

# Sub-command -> "module:function" (called with the remaining arguments, returns the exit
# status), imported only when chosen so that `fxtrack --help` and a run stay fast.
SUBCOMMANDS = {
    "claims": ("fxtrack.report.claims:main",
               "published benchmark claims checked against the runs (--plan: commands to measure "
               "them)"),
    "compare": ("fxtrack.report.compare:main",
                "candidate vs baseline runs (two MLflow filters): regressions, exit 1 past "
                "--fail-above"),
    "doctor": ("fxtrack.orchestrator.doctor:main",
               "installed frameworks, their versions, the devices each sees, the peak FLOP/s"),
    "report": ("fxtrack.report.cli:main",
               "comparison tables and charts from MLflow runs (stdout, Markdown, HTML, CSV, PNG)"),
    "ui": ("fxtrack.tracking.ui:main",
           "the MLflow UI on the store fxtrack used, and the link to its experiment's runs"),
    "sync": ("fxtrack.tracking.sync:main",
             "upload results that an unreachable tracking server missed"),
}
# A first word that is neither a Hydra override (key=value, +key=value, ~key) nor an option.
_WORD = re.compile(r"^[A-Za-z][\w.-]*$")

_USAGE = """\
fxtrack: one model, measured the same way in {framework_words}, logged to MLflow.

usage:
  python -m fxtrack [group=option ...] [key=value ...]      one run
  python -m fxtrack -m framework=torch,jax model=vit,bert   a sweep (one MLflow parent run)
  fxtrack {subcommands}

config groups (group=option):
{groups}
keys: batch_size (per device; null = the hardware's default), devices, steps, warmup_steps,
  seed, repeats (N workers per config, round-robin; medians + 95% intervals), timeout_s, verbose,
  resume (true: skip a run whose identical config already finished in the store),
  framework.compile (auto|true|false|tune), framework.compile_mode (torch: default|reduce-overhead|
  max-autotune), framework.python, hardware.cpu_threads, hardware.wait_for_idle_s,
  parallel (ddp|fsdp), memory (none|checkpoint), runtime (native|onnxruntime|tflite|openvino|
  tensorrt), quantize (none|dynamic_int8), tracking.experiment, tracking.uri,
  model.<size> (e.g. model.layers=2 model.image_size=32)
{framework_keys}
scenarios (scenario=<name>: what it measures; scenario.<key> its own options, with defaults):
{scenario_keys}
sub-commands:
{commands}
Hydra's own options: --cfg job (show the composed config), --hydra-help, -m / --multirun.
Your own options and sweep presets (hardware/, precision/, size/, experiment/ ...): put them in
  a directory named by $FXTRACK_CONFIG_DIR (several: separated by '{pathsep}'), or pass
  --config-dir DIR (searched first) or hydra.searchpath=[file:///DIR].
fxtrack --version: the installed version.
"""


def usage() -> str:
    options: dict[str, set[str]] = {}
    for root in [CONF_DIR, *user_config_dirs()]:
        for group in (d for d in root.iterdir() if d.is_dir()) if root.is_dir() else ():
            options.setdefault(group.name, set()).update(p.stem for p in group.glob("*.yaml"))
    # registered in Hydra's ConfigStore, not YAML files
    from fxtrack import families, scenarios

    options.setdefault("scenario", set()).update(scenarios.names())
    options.setdefault("model", set()).update(families.models())
    groups = "".join(f"  {name}: {', '.join(sorted(opts))}\n"
                     for name, opts in sorted(options.items()) if opts)
    commands = "".join(f"  fxtrack {name}: {text}\n" for name, (_, text) in SUBCOMMANDS.items())
    from fxtrack.config.frameworks import declared

    words = [f.said for f in sorted(declared().values(), key=lambda f: f.report_order)]
    framework_words = ", ".join(words[:-1]) + f" and {words[-1]}" if len(words) > 1 else words[0]
    return _USAGE.format(subcommands="|".join(SUBCOMMANDS), groups=groups, commands=commands,
                         framework_words=framework_words,
                         pathsep=os.pathsep, framework_keys=_framework_keys(),
                         scenario_keys=_scenario_keys())


def _framework_keys() -> str:
    """The keys a framework declares for itself (``framework.<key>``, its Settings)."""
    from fxtrack.config.frameworks import declared

    lines = [f"  framework={name}: framework.{key} ({'|'.join(s.choices)}, default {s.default}): "
             f"{s.help}\n"
             for name, framework in declared().items() for key, s in framework.settings.items()]
    return "framework keys of one framework:\n" + "".join(lines) if lines else ""


def _scenario_keys() -> str:
    """Each registered scenario, its summary and its options with their defaults, from the
    registry (each default is written once, in fxtrack/scenarios/options.py)."""
    from fxtrack import scenarios
    from fxtrack.scenarios.options import defaults

    lines = []
    for s in scenarios.SCENARIOS.values():
        keys = [f"{key}={'null' if value is None else value}"
                for key, value in defaults(s.options).items()]
        lines.append(f"  {s.name}: {s.summary}\n" + (
            textwrap.fill(" ".join(keys), 98, initial_indent="    ", subsequent_indent="    ")
            + "\n" if keys else ""))
    return "".join(lines)


def subcommand_parser() -> argparse.ArgumentParser:
    """Chooses the sub-command from the first word; each sub-command parses its own options."""
    parser = argparse.ArgumentParser(
        prog="fxtrack", add_help=False,
        usage="fxtrack SUBCOMMAND [options]  or  fxtrack [group=option ...] [key=value ...]",
        description="sub-commands: " + "; ".join(f"{name}: {text}"
                                                 for name, (_, text) in SUBCOMMANDS.items()))
    commands = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
    for name, (_, text) in SUBCOMMANDS.items():
        commands.add_parser(name, help=text, add_help=False)
    return parser


def main() -> None:
    from fxtrack.environment import redact_process_output, secure_process

    # Credentials inside tracking URIs move to MLFLOW_TRACKING_USERNAME/PASSWORD before Hydra
    # or MLflow print, log or spool anything (issue 14); whatever URI still carries some (a
    # preset's, a database's) is redacted on every terminal and log line (issue 60).
    secure_process(sys.argv)
    redact_process_output()
    try:
        app = command()
        if app is not None:  # called here, so that the job's frames start one below main
            try:
                app()
            except Exception as e:  # noqa: BLE001 - anything but a config error goes on as it was
                config_failure(e)
                raise
    except KeyboardInterrupt:  # Ctrl-C outside a worker: one line and the shell's status
        print("fxtrack: interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit as e:
        if _RAN_APP:
            exit_now(e.code)
        raise
    if _RAN_APP:
        exit_now(0)


_RAN_APP: list[bool] = []  # the Hydra app ran in this process: end it with exit_now


def exit_now(code: object) -> None:
    """End the process as ``sys.exit(code)`` would, without Python's module teardown: with
    MLflow, SQLAlchemy and pandas loaded that takes ~0.5 s on a 2-core machine, on every run,
    and does nothing a run needs. What the teardown would do that matters is done first: the
    other threads stopped and joined, the atexit handlers run (logging's flush and close,
    weakref finalizers such as temporary directories, multiprocessing's), stdout and stderr
    flushed."""
    import atexit
    import threading

    if code is not None and not isinstance(code, int):  # sys.exit("message"): print it, 1
        print(code, file=sys.stderr)
        code = 1
    # CPython's own first steps of finalisation, in its order: threading's shutdown (executor
    # workers told to stop, non-daemon threads joined), then the atexit handlers.
    shutdown = getattr(threading, "_shutdown", None)
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if shutdown is None or run_exitfuncs is None or \
            threading.current_thread() is not threading.main_thread():
        sys.exit(code)  # not CPython as we know it: let the interpreter end as usual
    shutdown()
    run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader went away
            pass
    os._exit(code or 0)


def command() -> Any:
    """Answer ``--version``, ``--help`` and the sub-commands (returns None, or exits with the
    sub-command's status); for a job, the checked command line's Hydra app, for main to call."""
    if sys.argv[1:2] == ["--version"]:
        from fxtrack import __version__

        print(f"fxtrack {__version__}")
        return None
    if len(sys.argv) > 1 and _WORD.match(sys.argv[1]):
        # before the sub-command starts anything (fxtrack ui's server): SIGTERM then unwinds
        # through its cleanup instead of ending this process with its children left running
        exit_on_sigterm()
        name = subcommand_parser().parse_args(sys.argv[1:2]).command  # unknown: exit 2
        sys.argv.pop(1)
        module, _, function = SUBCOMMANDS[name][0].partition(":")
        sys.exit(getattr(importlib.import_module(module), function)(sys.argv[1:]))
    if not (CONF_DIR / "config.yaml").is_file():
        sys.exit(f"fxtrack: no config.yaml in {CONF_DIR}: a broken install; reinstall fxtrack "
                 "(pip install fxtrack, or pip install -e . in a checkout)")
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(usage(), end="")
        return None
    import hydra

    from fxtrack.config import register
    from fxtrack.orchestrator.app import task

    register()
    _RAN_APP.append(True)
    exit_on_sigterm()
    sys.argv[1:] = with_user_searchpath(sys.argv[1:], user_config_dirs())
    check_output_dir(sys.argv[1:])
    # Hydra prints its composition errors over several lines and exits 1; raised instead (unless
    # the user asked for Hydra's own full traces), main reports each as one line with the config
    # errors' exit status, 2 (config_failure).
    if not os.environ.get("HYDRA_FULL_ERROR"):
        os.environ["HYDRA_FULL_ERROR"] = "1"
        _ONE_LINE_ERRORS.append(True)
    return hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(task)


_ONE_LINE_ERRORS: list[bool] = []  # HYDRA_FULL_ERROR set by fxtrack, not the user


def config_failure(e: Exception) -> None:
    """An error out of the Hydra app before the job started (orchestrator.app.STARTED): Hydra's
    composition error or its output directory's, as one line and exit status 2. Returns for
    the job's own errors and where the user set HYDRA_FULL_ERROR."""
    from fxtrack.config.validate import composition_error
    from fxtrack.orchestrator import app

    if app.STARTED or not _ONE_LINE_ERRORS:
        return
    line = composition_error(e)
    if line is None and isinstance(e, OSError):  # Hydra writing its output directory
        from fxtrack.config.validate import output_dir_error

        print(f"fxtrack: {output_dir_error(e, os.getcwd())}", file=sys.stderr)
        sys.exit(2)
    if line is not None:
        config_error(line)


def check_output_dir(args: list[str]) -> None:
    """Stop (exit 2, one line) where Hydra could not make the run's output directory (a
    read-only launch directory), before anything runs or is logged."""
    from fxtrack.config.validate import output_dir_refusal

    why = output_dir_refusal(args, os.getcwd())
    if why is not None:
        print(f"fxtrack: {why}", file=sys.stderr)
        sys.exit(2)


def config_error(line: str) -> None:
    """Stop before any work as the task does for an invalid config: one line, exit status 2."""
    print(f"fxtrack: invalid config: {line}", file=sys.stderr)
    sys.exit(2)


def exit_on_sigterm() -> None:
    """SIGTERM outside a worker's run (peak calibration, an upload) unwinds this process as
    SystemExit(143) instead of killing it outright: ``subprocess.run`` then kills its child (a
    calibration probe), nothing is left running, results stay in the spool, no traceback. While
    a worker runs, the runner's own handler forwards the signal to the worker instead."""
    import signal

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def with_user_searchpath(args: list[str], dirs: list[Path]) -> list[str]:
    """``args`` with ``dirs`` added to Hydra's config search path (after fxtrack's own conf/, so
    they add options without shadowing), merged into any ``hydra.searchpath=[...]`` given."""
    if not dirs:
        return args
    for d in dirs:
        if not d.is_dir():
            sys.exit(f"fxtrack: ${CONFIG_DIR_ENV} names {d}, which is not a directory")
    ours = [f"file://{d}" for d in dirs]
    for i, arg in enumerate(args):
        if arg.startswith("hydra.searchpath="):
            given = arg.partition("=")[2].strip().strip("[]")
            args = list(args)
            args[i] = f"hydra.searchpath=[{','.join([*filter(None, [given]), *ours])}]"
            return args
    # first: after an option such as `--cfg job`, argparse takes no more overrides
    return [f"hydra.searchpath=[{','.join(ours)}]", *args]
