"""The decoder LM's framework-neutral parts: the memory pre-check, tokens_per_s, the lm_table
preset, the generate rules and the report's LM tables. No framework is imported: a fake
framework stands in where a worker runs."""

from __future__ import annotations

import textwrap

import pandas as pd
import pytest
from conftest import run_fxtrack
from hydra import compose, initialize_config_dir

from fxtrack import architectures
from fxtrack.cli import CONF_DIR
from fxtrack.config import memory, register
from fxtrack.config.validate import Refused, WontFit, validate

LLAMA = architectures.resolve("llama")
TINY = architectures.resolve("llama", "tiny")
STATE = 16 * architectures.param_count("llama")  # fp32 weights + grads + AdamW m and v


GIB = 2**30


def device(gib: float, shared_by: int = 1):
    """A fake source of available memory: ``gib`` per device, whatever the device kind."""
    return lambda kind, devices: memory.Available(gib * GIB, "fake", shared_by)


def composed(*overrides: str, hydra: bool = False):
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra)


# --- the memory pre-check ---------------------------------------------------------------------

def test_canonical_llama_training_cannot_fit_this_cpus_memory_and_says_what_to_change():
    # this machine's 23.5 GiB (MemTotal) as the source, so the outcome does not depend on
    # where the test runs
    why = memory.refusal(LLAMA, "train", "fp32", None, "cpu", source=device(23.5))
    assert why is not None
    assert why.startswith("model=llama training at batch_size=1 needs ~27.0 GiB (weights 4.6 + "
                          "gradients 4.6 + AdamW moments 9.2 + activations 5.6 + logits 2.9")
    assert "more than the 23.5 GiB of fake" in why
    for fix in ("size=tiny", "fewer model.layers (16 now)", "parallel=fsdp", "precision=bf16",
                "memory=checkpoint", "model.seq_len (2048 now)"):
        assert fix in why, fix
    assert "batch_size (" not in why  # batch 1 already: not a fix to offer
    assert memory.refusal(TINY, "train", "fp32", None, "cpu", source=device(23.5)) is None


def test_the_training_state_is_16_bytes_a_parameter_and_fsdp_shards_it():
    est = memory.estimate(LLAMA, "train", "fp32", batch=1)
    state = est.parts["weights"] + est.parts["gradients"] + est.parts["AdamW moments"]
    assert state == STATE == est.sharded_state
    halved = memory.estimate(LLAMA, "train", "fp32", batch=1, shards=2)
    assert (halved.parts["weights"], halved.parts["gradients"], halved.parts["AdamW moments"]) == (
        est.parts["weights"] / 2, est.parts["gradients"] / 2, est.parts["AdamW moments"] / 2)
    assert halved.parts["activations"] == est.parts["activations"]  # each device's own batch
    assert est.parts["logits"] == 1 * 2048 * 128256 * 4 * 3
    bf16 = memory.estimate(LLAMA, "train", "bf16", batch=1)  # fp32 master weights stay
    assert bf16.parts["weights"] == est.parts["weights"]
    assert bf16.parts["bf16/fp16 weight copy"] == 2 * architectures.param_count("llama")
    assert bf16.parts["activations"] == est.parts["activations"] / 2
    remat = memory.estimate(LLAMA, "train", "fp32", batch=1, memory="checkpoint")
    assert remat.parts["activations"] < est.parts["activations"] / 4


def test_fsdp_over_two_gpus_fits_where_one_does_not_and_cpu_devices_share_the_host():
    gpu = device(20)  # one 20 GiB device each
    assert memory.refusal(LLAMA, "train", "fp32", 1, "gpu", source=gpu) is not None
    assert memory.refusal(LLAMA, "train", "fp32", 1, "gpu", devices=2, parallel="fsdp",
                          source=gpu) is None
    # on a CPU the two device processes share the host's memory: sharding does not help there
    why = memory.refusal(LLAMA, "train", "fp32", 1, "cpu", devices=2, parallel="fsdp",
                         source=device(23.5, shared_by=2))
    assert why is not None and "per device x 2 devices on one host" in why
    assert "hardware.nodes=N" in why


def test_a_one_gib_device_refuses_what_fits_a_large_one():
    one = device(1)
    assert memory.refusal(LLAMA, "generate", "fp32", 1, "gpu", source=one).startswith(
        "model=llama generate at batch_size=1 needs ~4.6 GiB (weights 4.6 + KV cache")
    bert = architectures.resolve("bert")  # the other families: their canonical state only
    why = memory.refusal(bert, "train", "fp32", 4, "gpu", source=one)
    assert why is not None and "activations not estimated for bert" in why
    assert memory.refusal(bert, "train", "fp32", 4, "gpu", source=device(80)) is None
    resized = architectures.resolve("bert", layers=48)  # no count in the table: not checked
    assert memory.refusal(resized, "train", "fp32", 4, "gpu", source=one) is None


def test_the_host_memory_is_memtotal_or_the_cgroup_limit_where_lower(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal:       24684092 kB\nMemFree: 1 kB\n")
    assert memory.host_memory_bytes(tmp_path) == (24684092 * 1024, "MemTotal")
    (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/memory.max").write_text("max\n")
    assert memory.host_memory_bytes(tmp_path)[1] == "MemTotal"
    (tmp_path / "sys/fs/cgroup/memory.max").write_text(f"{8 * GIB}\n")
    assert memory.host_memory_bytes(tmp_path) == (8 * GIB, "cgroup limit")


def test_validate_refuses_it_as_a_sweep_skips_refusals(monkeypatch):
    monkeypatch.setenv(memory.MEMORY_ENV, "23.5")
    with pytest.raises(WontFit, match="model=llama training") as caught:
        validate(composed("model=llama", "hardware=cpu"))
    assert isinstance(caught.value, Refused)  # what the sweep and app.skip catch
    validate(composed("model=llama", "hardware=cpu", "size=tiny"))
    monkeypatch.setenv(memory.MEMORY_ENV, "off")
    validate(composed("model=llama", "hardware=cpu"))


def test_the_cli_stops_with_exit_2_before_any_work(tmp_path):
    proc = run_fxtrack(tmp_path, "model=llama", "hardware=cpu", env={memory.MEMORY_ENV: "23.5"},
                       timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("fxtrack: will not fit in memory, nothing was run: "
                                  "model=llama training"), proc.stderr
    assert "size=tiny" in proc.stderr and "building" not in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()


# --- the generate rules -----------------------------------------------------------------------

def test_generate_needs_a_decoder_lm_and_one_device(tmp_path):
    with pytest.raises(Refused, match="generation runs on one device; set devices=1"):
        validate(composed("model=llama", "size=tiny", "scenario=generate", "devices=2"))
    proc = run_fxtrack(tmp_path, "scenario=generate", "model=vit", timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("fxtrack: not supported, nothing was run: scenario=generate "
                                  "with a vit model"), proc.stderr
    assert "use model=llama" in proc.stderr and not (tmp_path / "mlflow.db").exists()


# --- the lm_table preset ----------------------------------------------------------------------

def test_the_lm_table_preset_is_three_frameworks_by_train_and_generate():
    from fxtrack.config.frameworks import declared
    from fxtrack.orchestrator.sweep import sweep_jobs

    jobs = sweep_jobs(composed("experiment=lm_table", "size=tiny", hydra=True))
    cells = sorted((dict(o.split("=", 1) for o in job)["framework"],
                    dict(o.split("=", 1) for o in job)["scenario"]) for job in jobs)
    assert cells == sorted((f, s) for f in ("torch", "tensorflow", "jax")
                           for s in ("train", "generate"))
    for job in jobs:
        overrides = [o for o in job if not o.startswith("experiment=")]
        assert "model=llama" in overrides and "size=tiny" in overrides
        try:
            conf, arch = validate(composed(*overrides))
        except Refused as e:  # until a framework declares its generate capability
            assert "scenario=generate" in str(e), e
            assert not declared()[dict(o.split("=", 1) for o in job)["framework"]].has("generate")
            continue
        assert (arch.name, arch.layers, conf.scenario.name in ("train", "generate")) == (
            "llama", 2, True)


# --- tokens_per_s -----------------------------------------------------------------------------

FAKE_PACKAGE = '''
from fxtrack.frameworks.declaration import CompileRule, Framework

FRAMEWORK = Framework(
    name="fakelm", backend="fakelm.backend:FakeBackend", extra="fakelm", report_order=9,
    compile_rules=(CompileRule(False, "nothing to compile"),), compiled_tag="compiled",
    uncompiled_tag="eager", capabilities={"inference": "fakelm.backend"},
)
'''
FAKE_BACKEND = '''
from fxtrack.frameworks.base import Backend


def prepare(backend):
    return lambda: None


class FakeBackend(Backend):
    name = "fakelm"

    def version(self): return "0.1"
    def device_kind(self): return "cpu"
    def build(self, batch_size): self.loss = 10.0
    def param_count(self): return 1
    def loss_value(self, handle): return handle

    def train_step(self):
        self.loss *= 0.9
        return self.loss
'''


@pytest.fixture
def fake_lm(tmp_path, monkeypatch):
    package = tmp_path / "pkg" / "fakelm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(FAKE_PACKAGE))
    (package / "backend.py").write_text(textwrap.dedent(FAKE_BACKEND))
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    return "fakelm"


@pytest.mark.parametrize("scenario", ["train", "inference"])
def test_a_decoder_lm_logs_tokens_per_s_as_sequences_times_seq_len(fake_lm, tmp_path, scenario):
    from conftest import job_spec
    from fxtrack.worker.__main__ import run

    spec = job_spec("torch", "llama", tmp_path, package=fake_lm, scenario=scenario,
                    runner=f"fxtrack.scenarios.{scenario}.runner:run")
    spec.framework = "fakelm"
    result = run(spec)
    assert result.status == "FINISHED", result.error
    m = result.metrics
    assert m["tokens_per_s"] == pytest.approx(m["throughput_samples_per_s"] * TINY.seq_len)
    spec = job_spec("torch", "vit", tmp_path, package=fake_lm, scenario=scenario,
                    runner=f"fxtrack.scenarios.{scenario}.runner:run")
    spec.framework = "fakelm"
    assert "tokens_per_s" not in run(spec).metrics  # a ViT has no tokens


# --- the report's LM tables -------------------------------------------------------------------

def _frame(rows: list[dict]) -> pd.DataFrame:
    """A ``search_runs``-layout frame of synthetic runs (tags.*, metrics.*)."""
    out = []
    for i, r in enumerate(rows):
        tags = {"fxtrack.framework": r["fw"], "fxtrack.model": r.get("model", "llama"),
                "fxtrack.scenario": r.get("scenario", "train"), "fxtrack.precision": "fp32",
                "fxtrack.devices": "1", "fxtrack.hardware": "cpu", "fxtrack.status": "ok",
                "fxtrack.contended": "false", **r.get("tags", {})}
        out.append({"run_id": f"run{i}", "status": "FINISHED",
                    "start_time": pd.Timestamp("2026-01-01") + pd.Timedelta(seconds=i),
                    "end_time": pd.Timestamp("2026-01-01") + pd.Timedelta(seconds=i, milliseconds=500),
                    **{f"tags.{k}": v for k, v in tags.items()},
                    **{f"metrics.{k}": v for k, v in r["metrics"].items()}})
    return pd.DataFrame(out)


def _train(tokens, mfu=0.01, rss=900.0):
    return dict(throughput_samples_per_s=tokens / 32, tokens_per_s=tokens, mfu=mfu,
                peak_rss_mib=rss)


GEN = dict(throughput_samples_per_s=2.0, tokens_per_s=256.0, ttft_ms_p50=3.25,
           decode_ms_per_token_p50=1.5, decode_tokens_per_s=1333.0, kv_cache_mib=0.125,
           peak_rss_mib=700.0)


def test_the_report_shows_lm_runs_side_by_side_with_intervals_when_repeated():
    from fxtrack.report import lm, render
    from fxtrack.report.select import latest_runs

    repeats = [_train(t) for t in (1000.0, 1100.0, 1200.0)]
    frame = _frame([
        {"fw": "torch", "metrics": _train(2000.0, mfu=0.02)},
        *[{"fw": "jax", "metrics": m, "tags": {"fxtrack.repeat_of": "agg1"}} for m in repeats],
        {"fw": "jax", "metrics": dict(_train(1100.0), repeats=3.0),
         "tags": {"fxtrack.kind": "aggregate", "fxtrack.result_id": "agg1",
                  "fxtrack.repeats": "3"}},
        {"fw": "torch", "scenario": "generate", "metrics": GEN},
        {"fw": "jax", "scenario": "generate", "metrics": dict(GEN, peak_mem_device_mib=512.0),
         "tags": {"fxtrack.contended": "true"}},
        {"fw": "torch", "model": "vit", "metrics": {"throughput_samples_per_s": 5.0}},
        # equal repeats (a cache's size): the interval is the median, not its float noise
        *[{"fw": "tensorflow", "scenario": "generate", "metrics": dict(GEN, ttft_ms_p50=t),
           "tags": {"fxtrack.repeat_of": "agg2"}} for t in (3.0, 3.25, 3.5)],
        {"fw": "tensorflow", "scenario": "generate", "metrics": dict(GEN, repeats=3.0),
         "tags": {"fxtrack.kind": "aggregate", "fxtrack.result_id": "agg2",
                  "fxtrack.repeats": "3"}},
    ])
    runs = latest_runs(frame).runs
    train, generate = lm.tables(frame, runs)
    assert train.title == "Language models: train, fp32, x1, cpu"
    assert train.header == ["model", "framework", "tokens/s", "MFU", "peak memory MiB"]
    rows = {r[1]: r for r in train.rows}
    assert set(rows) == {"torch", "jax"}  # no ViT: it is not a language model
    assert rows["torch"][2:] == ["2,000.0", "2.0%", "900 RSS"]
    low, high = (float(x.replace(",", "")) for x in
                 rows["jax"][2].split(" [")[1].rstrip("]").split(", "))
    assert rows["jax"][2].startswith("1,100.0 [") and low < 1000 < 1200 < high  # the repeats' t
    assert generate.title == "Language models: generate, fp32, x1, cpu"
    assert generate.header[2:] == ["tokens/s", "TTFT p50 ms", "decode ms/token p50",
                                   "decode tokens/s", "KV cache MiB", "peak memory MiB"]
    rows = {r[1]: r for r in generate.rows}
    assert rows["torch"][2:] == ["256.0", "3.25", "1.50", "1,333.0", "0.12", "700 RSS"]
    assert rows["jax c"][-1] == "512"  # the device's peak where there is one; contended marked
    assert rows["tensorflow"][6] == "0.12 [0.12, 0.12]"
    page = render.markdown(render.Report("r", [], [lm.section(frame, runs)], []))
    assert "## Language models" in page and "decode tokens/s" in page
    assert lm.section(frame, runs[runs["model"] == "vit"]) is None


def test_fxtrack_report_writes_the_lm_tables(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from fxtrack.report.cli import main
    from fxtrack.tracking import reader

    frame = _frame([{"fw": "torch", "metrics": _train(2000.0)},
                    {"fw": "jax", "scenario": "generate", "metrics": GEN}])
    monkeypatch.setattr(reader, "load_runs", lambda uri, experiment, filter_string: frame)
    assert main(["--uri", f"sqlite:///{tmp_path / 'x.db'}", "--out", str(tmp_path),
                 "--format", "md"]) == 0
    page = (tmp_path / "report.md").read_text()
    assert "### Language models: train, fp32, x1, cpu" in page
    assert "### Language models: generate, fp32, x1, cpu" in page and "1,333.0" in page


def test_the_available_memory_can_be_replaced_or_the_check_skipped(monkeypatch):
    monkeypatch.setenv(memory.MEMORY_ENV, "10")
    assert memory.available("cpu", 2) == memory.Available(10 * GIB, memory.MEMORY_ENV, 2)
    assert memory.available("gpu", 2) == memory.Available(10 * GIB, memory.MEMORY_ENV, 1)
    monkeypatch.setenv(memory.MEMORY_ENV, "off")
    assert memory.available("cpu", 1) is None
    assert memory.refusal(LLAMA, "train", "fp32", None, "cpu") is None  # skipped


def test_serving_an_lm_holds_its_weights_and_kv_cache_as_generating_does_not_a_training_state():
    serve = memory.estimate(LLAMA, "serve", "bf16", batch=8, prompt_len=128, new_tokens=128)
    generate = memory.estimate(LLAMA, "generate", "bf16", batch=8, prompt_len=128, new_tokens=128)
    assert serve.parts == generate.parts and "KV cache" in serve.parts
    assert "gradients" not in serve.parts
