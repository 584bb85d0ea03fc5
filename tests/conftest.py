"""Shared test helpers: tiny architectures and JobSpecs for backend unit tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from fxtrack import architectures
from fxtrack.config.frameworks import packages
from fxtrack.worker.protocol import JobSpec

# The frameworks under test: name -> package, as conf/framework/<name>.yaml names them.
PACKAGES = packages()


def backend_class(spec: JobSpec):
    """The Backend class ``spec``'s framework declares (as the worker imports it)."""
    from fxtrack.frameworks.declaration import declaration, import_path

    return import_path(declaration(spec.package).backend)


def hlo_dots(hlo: str) -> list[tuple[str, list[str], str]]:
    """Every dot of an optimised HLO module's text: (result type, its two operands' types, the
    left operand's contracting dimension), e.g. ("f32", ["bf16", "bf16"], "1")."""
    types = dict(re.findall(r"%([\w.\-]+) = (\w+)\[", hlo))
    found = []
    for line in hlo.splitlines():
        m = re.search(r"= (\w+)\[[\d,]*\]\S* dot\(%([\w.\-]+), %([\w.\-]+)\), "
                      r"lhs_contracting_dims=\{(\d+)\}", line)
        if m:
            found.append((m.group(1), [types[m.group(2)], types[m.group(3)]], m.group(4)))
    return found


# The test run's own directory, made by the first pytest process (xdist's controller, or a
# lone one) and inherited by its workers and every process they start; removed at the end.
RUN_DIR_ENV = "FXTRACK_TESTS_RUN_DIR"
_MADE: list[str] = []
# XLA's compiled programs kept on disk in it, shared by every process of the run (JAX, Keras on
# JAX, TensorFlow's jit_compile): the suite compiles the same tiny models in dozens of workers,
# and a hit skips only XLA's backend compile (tracing and lowering still run). JAX's conformance
# batch took 53 s cold and 26 s warm here (2026-12-06). The tests' env only, not fxtrack's: a
# user's first step still compiles as it would.
XLA_CACHE_ENV = {"JAX_COMPILATION_CACHE_DIR": "{dir}/jax",
                 "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                 "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
                 "TF_XLA_FLAGS": "--tf_xla_persistent_cache_directory={dir}/tf"}


def pytest_configure(config):
    """An xdist worker in a session of its own, as a lone pytest process was: fxtrack's load
    sampler counts its own session's CPU as the run's, and the other worker's (same session
    otherwise) hid a busy loop from tests/test_load.py's contended check."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        try:
            os.setsid()
        except OSError:  # already a session or group leader: nothing to do
            pass
        _own_cores()
    elif hasattr(config.option, "loadscopereorder"):  # xdist's controller: hand files out in
        config.option.loadscopereorder = False  # the workers' order (FILE_SECONDS), not by count
    if RUN_DIR_ENV not in os.environ:
        import tempfile

        _MADE.append(tempfile.mkdtemp(prefix="fxtrack-tests-"))
        os.environ[RUN_DIR_ENV] = _MADE[0]
        if not any(k in os.environ for k in XLA_CACHE_ENV):  # a developer's own setting wins
            os.environ.update({k: v.format(dir=_MADE[0]) for k, v in XLA_CACHE_ENV.items()})


# Each xdist worker on cores of its own (a disjoint share of the allowed ones), inherited by
# every process it starts, so each job sizes its threads to them (hardware.cpu_threads' default).
# Two workers' jobs each at every core oversubscribed them: OpenMP and Eigen threads spin-wait
# at every op for a thread the other job's threads hold off the core. "shared" keeps every core
# for every worker. The cores the run had are kept for the tests about affinity.
CORES_ENV, ALL_CORES_ENV = "FXTRACK_TESTS_CORES", "FXTRACK_TESTS_ALL_CORES"


def _own_cores() -> None:
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if (os.environ.get(CORES_ENV) == "shared" or count < 2
            or not hasattr(os, "sched_setaffinity")):
        return
    allowed = sorted(os.sched_getaffinity(0))
    share = len(allowed) // count
    if share < 1:  # more workers than cores: nothing to split
        return
    index = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw")) % count
    os.environ.setdefault(ALL_CORES_ENV, ",".join(map(str, allowed)))
    os.sched_setaffinity(0, allowed[index * share:(index + 1) * share])


def all_cores() -> set[int]:
    """The cores the test run was given, before a worker took its share."""
    kept = os.environ.get(ALL_CORES_ENV)
    return {int(c) for c in kept.split(",")} if kept else set(os.sched_getaffinity(0))


# The heaviest test files first, so the two xdist workers finish together: --dist loadfile hands
# out files in order (xdist's default order, by test count, put the 63 s test_tracking_team
# last, and one worker ran it alone for 81 s while the other's core idled). Seconds per file
# summed over its tests in one `.ci/run`-style run (JUnit XML) on the 2-core AMD EPYC
# (2026-12-07); a file not listed (under 20 s) runs after these.
FILE_SECONDS = {
    "test_converge.py": 403, "test_conformance.py": 373, "test_keras.py": 264,
    "test_nothing_lost.py": 243, "test_jax.py": 221, "test_byom_examples.py": 181,
    "test_tracking_team.py": 166, "test_measurement.py": 164, "test_fairness.py": 164,
    "test_byom.py": 155, "test_repeats_chaos.py": 149, "test_tracking.py": 148,
    "test_byom_stateful.py": 140, "test_serve_outputs.py": 139, "test_scaling.py": 132,
    "test_tensorflow.py": 128, "test_memory_levers.py": 114, "test_slurm.py": 112,
    "test_batching.py": 106, "test_tracking_trust.py": 102, "test_byom_levers.py": 99,
    "test_claims.py": 95, "test_compare.py": 90, "test_serve.py": 88, "test_cli.py": 86,
    "test_secrets.py": 85, "test_from_run.py": 81, "test_tracking_ui.py": 81,
    "test_profile.py": 77, "test_torch.py": 71, "test_llama_jax.py": 69, "test_answer.py": 67,
    "test_byom_pipeline.py": 66, "test_system_metrics.py": 65, "test_runtimes.py": 61,
    "test_first_hour.py": 56, "test_calibration.py": 48, "test_figures.py": 45,
    "test_tracking_load.py": 43, "test_overhead.py": 42, "test_packaging.py": 38,
    "test_llama_torch.py": 36, "test_tracking_faults.py": 33, "test_byom_lm.py": 29,
    "test_byom_checkpoint.py": 27, "test_concurrency_search.py": 27, "test_fit.py": 27,
    "test_unsupported.py": 25, "test_bad_inputs.py": 25, "test_report.py": 21,
    "test_mfu_bench.py": 21}


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the order only matters to xdist's handing out
        return
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, 0))  # stable within a file


def pytest_unconfigure(config):
    import shutil

    for made in _MADE:
        shutil.rmtree(made, ignore_errors=True)


# Smaller than size=tiny where a check does not need the width: tiny ResNet-50 keeps its 25.6M
# parameters and tiny BERT its 30,522-token head (half of a framework's conformance batch); these
# keep every block kind (projection and identity shortcuts, BatchNorm) and learn a batch as fast.
SMALL = {"resnet50": dict(width=16, stage_sizes=(2, 1, 1, 1)), "bert": dict(vocab_size=2048)}


def tiny_arch(name: str, **overrides) -> architectures.Arch:
    return architectures.resolve(name, "tiny", **overrides)


def job_spec(framework: str, model: str, tmp_path: Path | None = None, size: str = "tiny",
             **overrides) -> JobSpec:
    """A JobSpec as the orchestrator would write it, for running a Backend in-process."""
    arch_overrides = overrides.pop("arch", {})
    fields = dict(
        result_id=uuid.uuid4().hex, framework=framework, package=PACKAGES[framework],
        scenario="train", runner="fxtrack.scenarios.train.runner:run",
        arch=architectures.resolve(model, size, **arch_overrides).to_json(), precision="fp32",
        hardware="cpu", devices=1, compile=False, seed=0, batch_size=2, steps=3, warmup_steps=1,
        result_path=str((tmp_path or Path(".")) / "result.json"), progress=False,
    )
    fields.update(overrides)
    # A test's compile=True/False is a forced choice, not framework.compile=auto.
    fields.setdefault("compile_request", "true" if fields["compile"] else "false")
    return JobSpec(**fields)


@pytest.fixture
def spec_factory(tmp_path):
    return lambda framework, model, **kw: job_spec(framework, model, tmp_path, **kw)


def run_fxtrack(cwd: Path, *args: str, env: dict | None = None,
                timeout: int = 1200) -> subprocess.CompletedProcess:
    """``python -m fxtrack ARGS`` in ``cwd`` as a user would run it, in ``fxtrack_env(cwd,
    env)``; its output captured."""
    return subprocess.run([sys.executable, "-m", "fxtrack", *args], cwd=cwd,
                          env=fxtrack_env(cwd, env), capture_output=True, text=True,
                          timeout=timeout)


def report_here(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``fxtrack report ARGS`` as ``run_fxtrack(cwd, "report", *ARGS)`` gives it (the store
    ``cwd/mlflow.db``, the files in ``cwd/fxtrack-report``, unless ARGS name others), run in
    this process: a report only reads the store, and its own process paid pandas', MLflow's and
    matplotlib's imports again (10 s of CPU against 1.5 s, 2026-12-07). Its output captured.
    A ``--log`` report writes a spool entry under $FXTRACK_HOME: take ``isolated_store``."""
    import contextlib
    import io

    from fxtrack.report import cli

    out, err = io.StringIO(), io.StringIO()
    argv = ["--uri", f"sqlite:///{cwd}/mlflow.db", "--out", str(cwd / "fxtrack-report"), *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return subprocess.CompletedProcess(["fxtrack", "report", *args], code, out.getvalue(),
                                       err.getvalue())


def fxtrack_env(cwd: Path, env: dict | None = None) -> dict[str, str]:
    """The environment of fxtrack run in ``cwd`` as a user would run it (``run_fxtrack``, or a
    process a test starts itself): no MLflow variables from the test's environment (the embedded
    store in ``cwd`` unless ``env`` names one), its spool under ``cwd/home``, the run's seeded
    peak cache unless ``env`` names a cache; ``env`` adds or overrides variables."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    full["FXTRACK_HOME"] = str(cwd / "home")
    full.update(env or {})
    if "FXTRACK_CACHE" not in full:  # a test about MFU names its own cache
        full.update(seed_peak_cache(Path(os.environ[RUN_DIR_ENV]) / "fxtrack-cache",
                                    keep=True))
    return full


@pytest.fixture
def isolated_store(tmp_path, monkeypatch) -> Path:
    """fxtrack called in this process, kept off the developer's own store: its spool under
    ``tmp_path/home`` (a logged report's or run's entry; the home ``fxtrack_env(tmp_path)``
    gives the processes a test starts), no $MLFLOW_TRACKING_* (the store, and its credentials,
    are the ones a test names). A module opts in with ``pytestmark =
    pytest.mark.usefixtures("isolated_store")``. Returns the FXTRACK_HOME it set."""
    home = tmp_path / "home"
    monkeypatch.setenv("FXTRACK_HOME", str(home))
    for key in [k for k in os.environ if k.startswith("MLFLOW_TRACKING_")]:
        monkeypatch.delenv(key)
    return home


def seed_peak_cache(cache: Path, keep: bool = False) -> dict[str, str]:
    """A peak-FLOP/s cache for this CPU (1 TFLOP/s for every framework), so runs under test do
    not calibrate: seconds of matmul probes a framework in every run (a busy 2-core machine's
    calibration is never cached), in tests that are not about MFU. ``keep``: a cache already
    there (the run's shared one) stays as it is. Returns the environment that points fxtrack
    at it."""
    import json

    from fxtrack.measure import peak
    from fxtrack.orchestrator import calibration

    path = cache / "peak_flops.json"
    if not (keep and path.exists()):
        entry = {"tflops": 1.0, "date": "2026-01-01", "contended": False, "other_cpu_frac": 0.0}
        key = peak.cache_key("cpu", "fp32", peak.thread_count(None))
        cache.mkdir(parents=True, exist_ok=True)
        part = cache / f"peak_flops.{os.getpid()}.part"  # whole for a concurrent reader
        part.write_text(json.dumps({key: {fw: entry for fw in calibration.frameworks()}}))
        part.replace(path)
    return {"FXTRACK_CACHE": str(cache)}


@pytest.fixture(autouse=True, scope="module")
def _free_framework_state():
    """After each test module, what the frameworks it imported in this process hold on to:
    JAX's compiled executables, Keras' graph and name state, TorchDynamo's compiled frames, and
    the models the module's tests left unreferenced. One pytest process runs the whole suite;
    without this, each in-process framework module's caches stay for the rest of the run.
    Frameworks a module did not import are not imported here."""
    yield
    import gc

    if "jax" in sys.modules:
        sys.modules["jax"].clear_caches()
    if "keras" in sys.modules:
        sys.modules["keras"].backend.clear_session()
    if "torch._dynamo" in sys.modules:
        sys.modules["torch._dynamo"].reset()
    gc.collect()
    if sys.platform.startswith("linux"):  # hand glibc's freed arenas back to the system
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)


# Continuous batching's slot script (each framework's slots test): a in slot 0; b joins slot 1
# after a's first step, while a decodes; c reuses slot 0 once a has its 6 tokens.
SLOT_PROMPTS = {"a": 5, "b": 18, "c": 3}  # request -> prompt length (buckets 16 and 20)


def drive_slots(slots) -> dict[str, list[int]]:
    """Each request's tokens from a framework's slots (``prepare_slots(backend, 2, [16, 20],
    ...)``) through the script above: the first token from its prefill, one per step after."""
    got: dict[str, list[int]] = {name: [] for name in SLOT_PROMPTS}
    owner: dict[int, str] = {}

    def admit(slot: int, name: str) -> None:
        owner[slot] = name
        slots.prefill(slot, SLOT_PROMPTS[name])
        got[name].append(int(slots.last[slot]))

    def step() -> None:
        slots.step(sorted(owner))
        for slot, name in owner.items():
            got[name].append(int(slots.last[slot]))

    admit(0, "a")
    step()
    admit(1, "b")
    for _ in range(4):
        step()
    admit(0, "c")
    step()
    step()
    return got
