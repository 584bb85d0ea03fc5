"""A serving sweep's window at a rate every framework and policy served (issue 58): the rate
searches walk one power-of-two grid from starts of their own, so a fast framework's probes and a
slow one's may share no passing rate; the sweep then serves one window more where it is missing,
tagged a probe of its search, and the report's common-rate table compares them there."""

from __future__ import annotations

import json

import pytest

from fxtrack.orchestrator import sweep


def _search(name, fw, answer, probes, batching="static"):
    return {"name": name, "status": "FINISHED", "metrics": {"max_rate_under_slo_rps": answer},
            "params": {"scenario.rate": "search", "scenario.batching": batching,
                       "scenario.num_requests": "4", "model.layers": "1"},
            "tags": {"fxtrack.scenario": "serve", "fxtrack.framework": fw, "fxtrack.model": "vit",
                     "fxtrack.precision": "fp32", "fxtrack.devices": "1",
                     "fxtrack.hardware": "cpu", "fxtrack.result_id": f"res-{name}"},
            "probes": probes}


def test_the_plan_probes_the_grids_rate_below_every_answer_where_it_is_missing():
    jobs = {
        # torch started at 8: 8, 16 passed, 32 failed, bisected to 24
        0: _search("torch", "torch", 24.0, [[8.0, "pass"], [16.0, "pass"], [32.0, "slo"],
                                            [24.0, "pass"]]),
        # jax started at 4: failed, halved to 2, passed, bisected to 3
        1: _search("jax", "jax", 3.0, [[4.0, "slo"], [2.0, "pass"], [3.0, "pass"]]),
        # another model's search, alone in its group: nothing to compare it with
        2: dict(_search("bert", "jax", 5.0, [[4.0, "pass"]]),
                params={"scenario.rate": "search", "model.layers": "2"}),
        3: {"name": "train", "status": "FINISHED", "metrics": {}, "params": {},
            "tags": {"fxtrack.scenario": "train"}},
    }
    ((rate, need, why),) = sweep.common_rate_plan(jobs)
    assert (rate, need) == (2.0, [0]) and "torch, jax" in why  # jax already served 2
    # a shared passing rate already: nothing more to run
    jobs[1]["probes"].append([8.0, "pass"])
    assert sweep.common_rate_plan(jobs) == []
    # a framework's policies count as cells of their own
    jobs[4] = _search("torch-cont", "torch", 1.5, [[1.0, "pass"], [2.0, "slo"]], "continuous")
    ((rate, need, _),) = sweep.common_rate_plan(jobs)
    assert (rate, sorted(need)) == (1.0, [0, 1])
    # a search that served nothing: said, nothing run
    jobs[4]["metrics"]["max_rate_under_slo_rps"] = 0.0
    ((rate, need, why),) = sweep.common_rate_plan(jobs)
    assert need == [] and "served no rate" in why


def test_a_probe_of_needs_a_fixed_rate():
    from fxtrack.scenarios.serve import ServeOptions

    with pytest.raises(ValueError, match="scenario.probe_of .* fixed scenario.rate"):
        ServeOptions(probe_of="abc")
    assert ServeOptions(rate="2", probe_of="abc").probe_of == "abc"


@pytest.mark.slow
def test_the_common_rate_window_runs_and_the_report_reads_it_as_a_probe_of_its_search(
        tmp_path, monkeypatch):
    """The sweep's step for real: a torch serve window at the planned rate, logged as a probe of
    the search it names; the report's windows for that search hold it, and the main tables
    count it through the search, never as a run of its own."""
    import mlflow
    from omegaconf import OmegaConf

    from conftest import fxtrack_env
    from fxtrack.scenarios.serve import section as serving
    from fxtrack.report.select import latest_runs
    from fxtrack.tracking import reader

    for key, value in fxtrack_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("fxtrack")
    search = client.create_run(exp, tags={  # the torch search the window completes
        "fxtrack.framework": "torch", "fxtrack.model": "vit", "fxtrack.scenario": "serve",
        "fxtrack.precision": "fp32", "fxtrack.devices": "1", "fxtrack.hardware": "cpu",
        "fxtrack.result_id": "res-torch", "fxtrack.status": "ok"})
    client.log_metric(search.info.run_id, "max_rate_under_slo_rps", 24.0)
    client.set_terminated(search.info.run_id)
    jobs = tmp_path / "multirun" / sweep.JOBS_DIR
    jobs.mkdir(parents=True)
    (jobs / "0000.json").write_text(json.dumps(_search("torch", "torch", 24.0, [[16.0, "pass"]])))
    (jobs / "0001.json").write_text(json.dumps(_search("jax", "jax", 3.0, [[2.0, "pass"]])))
    overrides = ["scenario=serve", "model=vit", "size=tiny", "hardware=cpu",
                 "scenario.rate=search", "scenario.num_requests=4", "scenario.slo.e2e_ms=5000",
                 "warmup_steps=1"]
    monkeypatch.setattr(sweep, "sweep_jobs", lambda config: [["framework=torch", *overrides],
                                                             ["framework=jax", *overrides]])
    sweep.common_rate_windows(OmegaConf.create({}), jobs)

    frame = reader.load_runs(uri, "fxtrack", None)
    (window,) = [r for _, r in frame.iterrows()
                 if r.get("tags.fxtrack.serve_probe_of") == "res-torch"]
    assert window["params.scenario.rate"] == "2" and window["metrics.serve_requests"] == 4
    assert window["tags.fxtrack.serve_probe"] in ("pass", "slo", "saturated")
    head = frame[frame["run_id"] == search.info.run_id].iloc[0]
    assert [w.rate for w in serving.windows(frame, head)] == [2.0]
    kept = latest_runs(frame)
    assert list(kept.runs["run_id"]) == [search.info.run_id]
    assert kept.skipped["probes counted in their search (fit, serve)"] == 1
