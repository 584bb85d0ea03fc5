"""The profile split (scenario.profile_steps, the ``profile`` capability): one tiny ViT train
run per framework that declares it (Keras on its default backend), profiled after its timed window by the framework's own
profiler; the categories sum to the profiled step's time by fxtrack's timer within 10%, the matmuls are found
(a rule that missed them would hand their time to overhead, which the sum cannot see), and
overhead is not most of the step. A framework without the capability is refused before any
work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import job_spec
from fxtrack.config.frameworks import declared
from fxtrack.frameworks.profiling import CATEGORIES
from fxtrack.worker.protocol import Result

ROOT = Path(__file__).resolve().parents[1]

PROFILED = [name for name, fw in declared().items() if fw.has("profile")]
OPTIONS = {"profile_steps": 5}


@pytest.fixture(scope="module", params=PROFILED)
def profiled(request, tmp_path_factory):
    """One tiny ViT train run, compiled as framework.compile=auto has it, through the worker as
    the orchestrator starts it (its own process: Keras reads its backend once, at import)."""
    name = request.param
    where = tmp_path_factory.mktemp(name)
    # one thread: on a shared 2-core machine other work stalls a 2-thread step's barriers and
    # spreads its steps far more
    # batch 16: at batch 2 torch.profiler's own cost per op was 16% of the tiny ViT's 40 ms step
    spec = job_spec(name, "vit", where, steps=10, warmup_steps=2, compile=False, batch_size=16,
                    compile_request="auto", options=dict(OPTIONS), cpu_threads=1)
    spec.dump(where / "spec.json")
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    # a session of its own, as the orchestrator starts a worker: the load sampler counts every
    # other session's CPU (in this test's session the other xdist worker's read as the run's own)
    proc = subprocess.run([sys.executable, "-m", "fxtrack.worker", str(where / "spec.json")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                          start_new_session=True)
    result = Result.read(Path(spec.result_path))
    assert proc.returncode == 0 and result.status == "FINISHED", (result.error,
                                                                  proc.stderr[-2000:])
    return name, result


@pytest.mark.slow  # four worker processes: about 55 s on 2 cores, 75 s on a busy machine
def test_the_split_sums_to_the_step_time_within_10_percent(profiled):
    name, result = profiled
    m = result.metrics
    total = sum(m[f"profile_{c}_ms"] for c in CATEGORIES)
    assert total == pytest.approx(m["profile_step_ms"], rel=1e-6)  # overhead is the rest
    # against the same profiled calls timed by fxtrack's timer: an annotation that closed
    # before the device was done, or a span read from the wrong step, reads short or long; the
    # same calls share one load, so a busy machine moves both (against unprofiled steps around
    # them, a shared CI machine once read 1.34x with no contention seen: the profiler's own
    # cost, a benchmark figure, printed here and in bench/mfu.py --profile)
    timed = m["profile_timed_step_ms"]
    figures = (f"{name}: profiled step {total:.1f} ms by the trace, {timed:.1f} ms by the timer; "
               f"unprofiled {m['profile_unprofiled_step_ms']:.1f} ms (profile contended "
               f"{result.tags.get('profile_contended')})")
    print(figures)  # shown with -s: the figures a closing note quotes
    assert total == pytest.approx(timed, rel=0.10), figures
    assert total <= timed * 1.001, figures  # a span inside the call it annotates


@pytest.mark.slow
def test_the_matmuls_are_found_and_overhead_is_not_most_of_the_step(profiled):
    name, result = profiled
    m = result.metrics
    assert m["profile_matmul_ms"] > 0.1 * m["profile_step_ms"], (name, m)
    assert m["profile_overhead_ms"] < 0.5 * m["profile_step_ms"], (name, m)
    assert all(m[f"profile_{c}_ms"] >= 0 for c in CATEGORIES)
    assert result.tags["profiler"]


def test_a_framework_without_the_capability_is_refused_before_any_work(monkeypatch):
    import dataclasses

    from fxtrack.scenarios import rules

    torch = declared()["torch"]
    bare = dataclasses.replace(torch, capabilities={k: v for k, v in torch.capabilities.items()
                                                    if k != "profile"})
    c = rules.Combination("torch", "train", "fp32", family="vit", options_set=("profile_steps",))
    why = rules.refusal(c, bare)
    assert why == ("scenario.profile_steps with scenario=train is not supported by torch: "
                   "not implemented for this framework")
    assert rules.refusal(dataclasses.replace(c, options_set=()), bare) is None


def test_the_option_is_typed_off_by_default_and_asks_for_the_capability_only_when_set():
    from fxtrack.scenarios import options_set
    from fxtrack.scenarios.train import TrainOptions

    assert TrainOptions().profile_steps == 0
    with pytest.raises(ValueError, match="scenario.profile_steps must be >= 0"):
        TrainOptions(profile_steps=-1)
    assert options_set("train", TrainOptions()) == ()
    assert options_set("train", {"profile_steps": 2}) == ("profile_steps",)
    assert options_set("scaling", {}) == ()  # scaling's children train without the option


def test_the_split_shares_overlapping_threads_and_leaves_gaps_to_overhead():
    from fxtrack.frameworks.profiling import Op, Trace, split

    ops = [Op(0, 40, "a", "matmul"), Op(10, 20, "a", "attention"),  # nested: the inner owns
           Op(30, 50, "b", "optimizer")]  # overlaps a's matmul for 10 ns: shared half and half
    done = split(ops, Trace([(0, 100), (0, 300)], [], [1e-7, 3e-7]), "test")
    ns = {k: round(v * 1e9, 6) for k, v in done.seconds.items()}
    assert ns == {"matmul": 25, "attention": 10, "norm_elementwise": 0, "optimizer": 15,
                  "overhead": 50}
    assert done.step_s * 1e9 == pytest.approx(100)  # the median by span of two: the first
    assert done.timed_step_s * 1e9 == pytest.approx(200)
