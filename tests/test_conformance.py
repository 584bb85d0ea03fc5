"""The scenario contract every declared framework keeps, in one module parametrised over the
declarations (``fxtrack.config.frameworks.declared()``): a fifth framework is tested by
declaring it. hardware=gpu without a GPU fails in one clear line; scenario=inference,
scenario=checkpoint (an exact restore, a serving export) and scenario=pipeline run where the
capabilities are declared, and are a "not supported" run, with the declared reason, where they
are not; two nodes train as one job where no declared limit refuses it; a lever whose
capability is undeclared is refused before any work. Training, generation and serving run for
every framework at tiny size too: ``RUN_HERE`` says how each scenario of ``scenarios()`` runs
here (``ELSEWHERE``, which file tests the orchestrator's own sweeps), and a scenario in neither
fails ``test_every_scenario_is_covered``. The one "loss falls" check and the one
parameter-count check of the suite live here. What is one framework's own (parity with its
reference, its idioms) stays in its own test file.

Cost: each framework's jobs run one after another in ONE fresh worker process (``BATCH``), as a
real worker runs them (its environment prepared before the framework is imported: Keras picks
its backend then), once per module; the tests read their results. Tiny models, 3 steps (training: 20, for its
loss to fall)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from conftest import SMALL, job_spec
from fxtrack import architectures
from fxtrack.config.frameworks import declared
from fxtrack.frameworks.declaration import LEVERS, Framework
from fxtrack.worker.protocol import JobSpec, Result
from fxtrack.orchestrator.runner import worker_command
from fxtrack import scenarios as registry
from fxtrack.paths import CONF_DIR
from fxtrack.scenarios.rules import Combination, refusal

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS: dict[str, Framework] = declared()
NAMES = list(FRAMEWORKS)

# scenario -> the capabilities it asks for, in its order (the first absent one is the refusal)
NEEDS = {"inference": ("inference",), "checkpoint": ("checkpoint", "inference", "serving_export"),
         "pipeline": ("pipeline",)}
# The models each scenario runs on: BatchNorm state (ResNet), token inputs (BERT), ViT's
# LayerNorm-only state; the pipeline's two input kinds (images, tokens).
MODELS = {"inference": ("resnet50", "bert"), "checkpoint": ("resnet50", "bert", "vit"),
          "pipeline": ("resnet50", "bert")}
PIPELINE = {"dataset_samples": 32, "loader_workers": 1}

# The scenarios run here for every framework that may run them (the framework-neutral rules and
# its declaration say which: ``scenario_refusal``): scenario -> (models, JobSpec overrides).
# Training: 20 losses (19 timed steps and the warm-up) at batch 4, every model family (tiny
# ResNet's BatchNorm is unstable at batch 2 on Keras' torch backend, see tests/test_keras.py).
SERVE = {"prompt_len": 8, "new_tokens": 3, "rate": "40", "num_requests": 8, "max_batch": 2,
         "batch_buckets": [1, 2], "slo": {}}  # as the orchestrator writes them (every model)
RUN_HERE: dict[str, tuple[tuple[str, ...], dict]] = {
    "train": (("resnet50", "bert", "vit", "llama"), dict(steps=19, warmup_steps=1, batch_size=4)),
    "generate": (("llama",), dict(options={"prompt_len": 8, "new_tokens": 3})),
    "serve": (("vit", "llama"), dict(batch_size=None, warmup_steps=1, options=SERVE)),
}
# Scenarios that are the orchestrator's sweeps of training runs (one worker per probe or
# device count), or whose check spans the sweep (converge: each framework's losses against the
# first's, on real data), not one worker job: where their every-framework tests live.
ELSEWHERE = {"fit": "test_fit.py", "scaling": "test_scaling.py", "converge": "test_converge.py"}


def scenarios() -> list[str]:
    """Every scenario fxtrack has, by name: the one place the suite reads the list, the
    scenario registry (``fxtrack.scenarios.SCENARIOS``)."""
    return sorted(registry.names())


def scenario_refusal(name: str, scenario: str, model: str) -> str | None:
    """Why ``name`` has no path for ``scenario`` on ``model`` (the rules and the framework's
    declaration, as validation reads them), or None."""
    return refusal(Combination(framework=name, scenario=scenario, precision="fp32",
                               device_kind="cpu", family=architectures.family(model)),
                   FRAMEWORKS[name])


GLOBAL_BATCH = 4  # two nodes x one device x batch 2
# The restore guard is shared scenario code: tested once, on the first framework with a
# checkpoint, by a restore that restores nothing.
GUARDED = next((n for n, f in FRAMEWORKS.items() if all(map(f.has, NEEDS["checkpoint"]))), None)

# Runs in the worker process: each spec in turn; "hollow" specs get a restore that does nothing.
BATCH = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from fxtrack.frameworks.declaration import declaration
    from fxtrack.worker.protocol import JobSpec
    from fxtrack.worker import __main__ as worker

    jobs = json.loads(sys.argv[1])  # [[spec path, hollow restore?], ...]
    specs = [JobSpec.read(Path(path)) for path, _ in jobs]
    worker.prepare_environment(specs[0])  # before the framework is imported, as a worker does
    for spec, (_, hollow) in zip(specs, jobs):
        if hollow:
            ckpt = declaration(spec.package).capability("checkpoint")
            real, ckpt.restore = ckpt.restore, lambda backend, directory: None
        worker.run(spec).dump(Path(spec.result_path))
        if hollow:
            ckpt.restore = real
""")


def missing(framework: Framework, scenario: str) -> str | None:
    """The first capability ``scenario`` needs that ``framework`` does not declare."""
    return next((c for c in NEEDS[scenario] if not framework.has(c)), None)


def undeclared_levers(name: str) -> list[tuple[str, str]]:
    return [lever for lever, cap in LEVERS.items() if not FRAMEWORKS[name].has(cap)]


def lever_overrides(field: str, value: str) -> dict:
    # fsdp on one device is refused by the framework-neutral rule first: two devices
    return {field: value, **({"devices": 2} if (field, value) == ("parallel", "fsdp") else {})}


def two_node_refusal(name: str) -> str | None:
    return refusal(Combination(framework=name, scenario="train", precision="fp32", nodes=2,
                               device_kind="cpu", family="vit"), FRAMEWORKS[name])


def compiled(name: str, model: str = "vit") -> bool:
    """framework.compile=auto's choice on a CPU for ``model``'s family: the mode a user's run
    takes (Keras' op-by-op mode, never auto's choice, took 2.6x as long as its jit here)."""
    arch = architectures.resolve(model, "tiny", **SMALL.get(model, {}))
    return FRAMEWORKS[name].resolve_compile("cpu", arch.family, dims=arch.dims)[0]


def launcher(name: str) -> str:
    """The launcher conf/framework/<name>.yaml names (torchrun for torch's multi-process runs)."""
    return OmegaConf.load(CONF_DIR / "framework" / f"{name}.yaml").get("launcher", "process")


def jobs(name: str, work: Path) -> dict[str, tuple[JobSpec, bool]]:
    """This framework's conformance jobs: key -> (spec, hollow restore?). The hardware=gpu job
    runs last: the process hides every GPU (the first spec is hardware=cpu), so it fails the
    same way on a machine with one."""
    framework, out = FRAMEWORKS[name], {}

    def add(key: str, model: str, hollow: bool = False, **kw) -> None:
        kw.setdefault("compile", compiled(name, model))
        out[key] = (job_spec(name, model, work / key, arch=SMALL.get(model, {}), **kw), hollow)

    for scenario, models in MODELS.items():
        kw = dict(scenario=scenario, runner=registry.get(scenario).runner_path,
                  options=PIPELINE if scenario == "pipeline" else {})
        if missing(framework, scenario):
            add(f"refused-{scenario}", "vit", **kw)
        else:
            for model in models:
                add(f"{scenario}-{model}", model, **kw)
    for scenario, (models, overrides) in RUN_HERE.items():
        for model in models:
            if not scenario_refusal(name, scenario, model):
                add(f"{scenario}-{model}", model, scenario=scenario,
                    runner=registry.get(scenario).runner_path, **overrides)
    if name == GUARDED:
        add("hollow-restore", "vit", hollow=True, scenario="checkpoint",
            runner="fxtrack.scenarios.checkpoint.runner:run")
    for field, value in undeclared_levers(name):
        add(f"refused-{field}={value}", "vit", **lever_overrides(field, value))
    if two_node_refusal(name):
        add("refused-nodes=2", "vit", nodes=2, node_rank=0, coordinator="127.0.0.1:1")
    add("gpu", "vit", hardware="gpu")
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """name -> {job key: Result}, each framework's batch run once, when a test first asks."""
    done: dict[str, dict[str, Any]] = {}

    def get(name: str) -> dict[str, Any]:
        if name not in done:
            work = tmp_path_factory.mktemp(f"conform-{name}")
            specs = jobs(name, work)
            paths = []
            for key, (spec, hollow) in specs.items():
                (work / key).mkdir()
                spec.dump(work / key / "spec.json")
                paths.append([str(work / key / "spec.json"), hollow])
            env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
            env.update(FXTRACK_CACHE=str(work / "cache"),
                       PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
            proc = subprocess.run([sys.executable, "-c", BATCH, json.dumps(paths)], cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=1800)
            assert proc.returncode == 0, proc.stderr[-3000:]
            done[name] = {key: Result.read(Path(spec.result_path))
                          for key, (spec, _) in specs.items()}
            done[name]["cache"] = work / "cache"  # the pipeline's datasets
        return done[name]

    return get


def cases(scenario: str) -> list:
    """(framework, model) for every framework and ``scenario``'s models; skipped, with the
    declared reason, where the framework lacks a capability the scenario needs."""
    out = []
    for name, framework in FRAMEWORKS.items():
        absent = missing(framework, scenario)
        marks = [pytest.mark.skip(reason=str(framework.unsupported(absent)))] if absent else []
        out += [pytest.param(name, model, marks=marks, id=f"{name}-{model}")
                for model in MODELS[scenario]]
    return out


def _finished(result: Result) -> dict:
    assert result.status == "FINISHED", result.error
    assert result.guard == "ok", result.guard
    return result.metrics


def run_here(scenario: str) -> list:
    """(framework, model) for every framework and ``scenario``'s models in RUN_HERE; skipped,
    with the refusal, where the framework has no path for it."""
    out = []
    for name in NAMES:
        for model in RUN_HERE[scenario][0]:
            why = scenario_refusal(name, scenario, model)
            out.append(pytest.param(name, model, id=f"{name}-{model}",
                                    marks=[pytest.mark.skip(reason=why)] if why else []))
    return out


def test_every_scenario_is_covered():
    """A new scenario is run here for every framework, or names the file of its sweep tests."""
    covered = set(MODELS) | set(RUN_HERE) | set(ELSEWHERE)
    assert set(scenarios()) <= covered, sorted(set(scenarios()) - covered)
    assert all((ROOT / "tests" / f).exists() for f in ELSEWHERE.values())


# --- training, generation, serving -------------------------------------------------------------

@pytest.mark.parametrize("name, model", run_here("train"))
def test_loss_falls_over_20_steps(results, name, model):
    """The suite's one "loss falls" check: every framework, every model family, 20 steps."""
    result = results(name)[f"train-{model}"]
    _finished(result)
    losses = result.series["loss"]
    assert len(losses) == 20 and all(math.isfinite(x) for x in losses), losses
    if architectures.spec(model).generates:  # a fresh LM starts near log(vocab): 0.2 nats
        assert losses[-1] < losses[0] - 0.2, losses
    else:  # the image and masked-LM models learn their fixed synthetic batch fast
        assert losses[-1] < 0.5 * losses[0], losses
    assert len(result.series["step_time_ms"]) == 19
    assert result.metrics["throughput_samples_per_s"] > 0


@pytest.mark.parametrize("model", RUN_HERE["train"][0])
def test_every_framework_builds_the_same_parameter_count(results, model):
    """The suite's one cross-framework parameter count: each framework's tiny model has the
    same trainable parameters (the canonical sizes, against architectures.param_count, are
    counted without allocating in each framework's own file)."""
    counts = {name: results(name)[f"train-{model}"].metrics.get("param_count")
              for name in NAMES if not scenario_refusal(name, "train", model)}
    assert len(counts) >= 2 and len(set(counts.values())) == 1, counts
    if model == "llama":  # the closed form of the Llama family
        assert next(iter(counts.values())) == architectures.llama_params(
            architectures.resolve(model, "tiny"))["total"]


@pytest.mark.parametrize("name, model", run_here("generate"))
def test_generate_decodes_through_the_kv_cache(results, name, model):
    m = _finished(results(name)[f"generate-{model}"])  # guard: cached decode = uncached forward
    assert m["tokens_per_s"] > 0 and m["kv_cache_mib"] > 0


@pytest.mark.parametrize("name, model", run_here("serve"))
def test_serve_answers_every_request(results, name, model):
    m = _finished(results(name)[f"serve-{model}"])
    assert m["serve_requests"] == SERVE["num_requests"]
    assert m["serve_e2e_ms_p50"] > 0 and m["request_throughput_rps"] > 0
    if architectures.spec(model).generates:
        assert m["serve_ttft_ms_p50"] > 0


# --- hardware=gpu without a GPU ---------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_gpu_requested_without_a_gpu_fails_in_one_clear_line(results, name):
    result = results(name)["gpu"]
    assert result.status == "FAILED" and "unsupported" not in result.tags
    assert result.error.startswith("RuntimeError: hardware=gpu, but ") and " sees no " in \
        result.error, result.error
    assert "param_count" not in result.metrics  # refused before the build


# --- the scenarios a framework declares ------------------------------------------------------

@pytest.mark.parametrize("name, model", cases("inference"))
def test_inference_scenario_runs(results, name, model):
    m = _finished(results(name)[f"inference-{model}"])
    assert m["throughput_samples_per_s"] > 0 and m["latency_ms_p50"] > 0


@pytest.mark.parametrize("name, model", cases("checkpoint"))
def test_restored_checkpoint_reproduces_the_next_step(results, name, model):
    m = _finished(results(name)[f"checkpoint-{model}"])
    assert m["checkpoint_restore_exact"] == 1.0
    assert m["loss_after_restore"] == m["loss_next_step"] and m["checkpoint_mib"] > 0


@pytest.mark.parametrize("name, model", cases("checkpoint"))
def test_checkpoint_exports_for_serving_and_times_both_models(results, name, model):
    """The same run as above: the serving export, loaded back, against the live model."""
    m = _finished(results(name)[f"checkpoint-{model}"])
    assert m["export_mib"] > 0 and m["export_s"] > 0
    assert m["live_latency_ms_p50"] > 0 and m["export_latency_ms_p50"] > 0
    assert m["export_latency_ratio"] == pytest.approx(
        m["export_latency_ms_p50"] / m["live_latency_ms_p50"])


@pytest.mark.skipif(GUARDED is None, reason="no declared framework has a checkpoint")
def test_restore_that_does_not_reproduce_fails_the_guard(results):
    """The guard can fail: restoring nothing leaves the state one step further on."""
    result = results(GUARDED)["hollow-restore"]
    assert result.metrics["checkpoint_restore_exact"] == 0.0
    assert "did not reproduce the next step's loss" in result.guard


@pytest.mark.parametrize("name, model", cases("pipeline"))
def test_pipeline_scenario_feeds_training_from_disk(results, name, model):
    got = results(name)
    m = _finished(got[f"pipeline-{model}"])
    assert m["pipeline_samples_per_s"] > 0 and m["resident_samples_per_s"] > 0
    # signed, from the two windows' own figures: a fed window may beat the resident one (and on
    # a shared machine either window may be slowed), so its size is not asserted, its meaning is
    assert m["input_bound_fraction"] == pytest.approx(
        1 - m["throughput_samples_per_s"] / m["resident_samples_per_s"])
    assert m["input_bound_fraction"] < 1
    written = list((got["cache"] / "datasets").iterdir())  # one per model, written once
    assert len(written) == len(MODELS["pipeline"])
    assert all((d / "complete").exists() for d in written)


# --- what a framework does not declare: a "not supported" run, never a crash ----------------

def _refused(result: Result, why: str) -> None:
    assert result.status == "FAILED" and result.tags.get("unsupported") == "true", result.error
    assert result.error.startswith("NotSupported: ") and why in result.error, result.error
    assert "param_count" not in result.metrics  # refused before the build


REFUSED_SCENARIOS = [pytest.param(n, s, id=f"{n}-{s}") for n, f in FRAMEWORKS.items()
                     for s in NEEDS if missing(f, s)]


@pytest.mark.skipif(not REFUSED_SCENARIOS, reason="every framework declares every scenario")
@pytest.mark.parametrize("name, scenario", REFUSED_SCENARIOS or [("", "")])
def test_an_undeclared_scenario_is_a_not_supported_run(results, name, scenario):
    framework = FRAMEWORKS[name]
    # the declared reason, whichever check refused it first (the rules before the build name
    # the scenario and the framework's version; Framework.capability, the capability)
    why = str(framework.unsupported(missing(framework, scenario))).split(": ", 1)[1]
    _refused(results(name)[f"refused-{scenario}"], why)


@pytest.mark.parametrize("name, lever", [
    pytest.param(n, lever, id=f"{n}-{lever[0]}={lever[1]}",
                 marks=[pytest.mark.skip(reason=f"{n} declares {LEVERS[lever]}: the lever's own "
                                                "tests run it")] if f.has(LEVERS[lever]) else [])
    for n, f in FRAMEWORKS.items() for lever in LEVERS])
def test_an_undeclared_lever_is_refused_before_any_work(results, name, lever):
    field, value = lever
    framework = FRAMEWORKS[name]
    result = results(name)[f"refused-{field}={value}"]
    combination = Combination(framework=name, scenario="train", precision="fp32",
                              device_kind="cpu", family="vit", **lever_overrides(field, value))
    why = refusal(combination, framework, result.tags["framework_version"])
    assert framework.absent[LEVERS[lever]] in why  # what validation says: the declared reason
    # the worker says the same, unless its backend refused a declared limit of the combination
    # first (keras: devices > 1)
    limits = [limit.why for limit in framework.limits if limit.when(combination)]
    assert result.error == f"NotSupported: {why}" or any(w in result.error for w in limits), \
        result.error
    _refused(result, f"is not supported by {name}")


# --- two nodes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [
    pytest.param(n, marks=[pytest.mark.skip(reason=two_node_refusal(n))] if two_node_refusal(n)
                 else []) for n in NAMES])
def test_two_nodes_on_loopback_train_as_one_job(tmp_path, name):
    """Two node processes on 127.0.0.1 (as the orchestrator starts them: torchrun for torch),
    one device each: both finish, node 0 alone writes the Result, and its throughput counts the
    global batch."""
    from servers import free_port

    coordinator, procs = f"127.0.0.1:{free_port()}", []
    for rank in (0, 1):
        node = tmp_path / f"node{rank}"
        node.mkdir()
        spec = job_spec(name, "vit", node, nodes=2, node_rank=rank, coordinator=coordinator,
                        devices=1, compile=compiled(name), launcher=launcher(name))
        spec.dump(node / "spec.json")
        procs.append(subprocess.Popen(worker_command(spec, sys.executable, node / "spec.json"),
                                      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    logs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [log[-3000:] for log in logs]
    assert not (tmp_path / "node1" / "result.json").exists()  # node 0 speaks for both
    m = _finished(Result.read(tmp_path / "node0" / "result.json"))
    samples_per_step = m["throughput_samples_per_s"] * m["step_time_ms_mean"] / 1e3
    assert samples_per_step == pytest.approx(GLOBAL_BATCH, rel=0.3)


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=[] if two_node_refusal(n) else [pytest.mark.skip(
        reason=f"{n} declares no limit against two nodes")]) for n in NAMES])
def test_two_nodes_where_a_declared_limit_refuses_them_is_a_not_supported_run(results, name):
    _refused(results(name)["refused-nodes=2"], two_node_refusal(name).split(": ", 1)[1])
