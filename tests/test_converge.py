"""data=<name> and scenario=converge: the splits, the one-line refusals of bad data before any
work, the trajectory check, and one tiny end-to-end sweep (torch, data=file) whose logged
time to target is recomputed from its logged eval history."""

from __future__ import annotations

import hashlib
import json
import re
import math
from pathlib import Path

import numpy as np
import pytest

from fxtrack import data, families
from fxtrack.config.validate import ConfigError, validate
from fxtrack.scenarios.converge import check as converge_check
from fxtrack.scenarios.converge import runner as converge
from tests.conftest import report_here, run_fxtrack, seed_peak_cache
from tests.test_config import composed

CONVERGE = ("scenario=converge", "model=vit", "size=tiny", "model.layers=1", "model.hidden=16",
            "model.heads=2", "model.mlp_dim=32")


# data=file has no declared defaults (fxtrack.families.quality): the run names its own
OWN_TARGET = ("scenario.metric=accuracy", "scenario.target=0.9", "scenario.max_epochs=1",
              "scenario.eval_every=5", "scenario.lr=0.01")


def tiny_images(path: Path, n: int = 96, side: int = 8, classes: int = 3) -> Path:
    """A learnable .npz: each class a bright band in its own rows, plus noise."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, classes, n)
    x = rng.random((n, side, side)).astype(np.float32) * 0.3
    for i, label in enumerate(y):
        x[i, label * 2:label * 2 + 2, :] += 1.0
    np.savez(path, x=x, y=y)
    return path


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        validate(composed(*overrides))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_the_split_is_fixed_and_the_held_out_rows_are_never_in_a_training_batch():
    split = data.load({"name": "mnist", "path": None, "label": "label", "holdout": 0.2})
    assert split.sizes() == {"train": 4000, "held_out": 1000} and split.shape == (28, 28, 1)
    assert split.classes == 10 and set(np.unique(split.y_train)) == set(range(10))
    train, held = data.holdout_rows(5000, 0.2)
    assert not set(train) & set(held) and len(train) + len(held) == 5000
    held_rows = {hashlib.sha1(row.tobytes()).digest() for row in split.x_held}
    n = data.samples(split, 1)
    for epoch in (0, 1):
        order = data.epoch_order(n, seed=0, epoch=epoch)
        for b in range(n // 500):
            batch = data.batch(split, order[b * 500:(b + 1) * 500], 1)
            grey = batch["images"][..., :1] * 0.5 + 0.5  # back to the stored pixels
            assert batch["images"].shape == (500, 28, 28, 3)
            assert not {hashlib.sha1(row.tobytes()).digest() for row in grey} & held_rows


def test_pycode_holds_out_whole_files():
    files = data.pycode_files()
    held = [r for r, _ in files if data.holdout_file(r, 0.2)]
    assert files and 0.1 < len(held) / len(files) < 0.3  # CRC-32 spreads them evenly
    split = data.load({"name": "pycode", "path": None, "label": "label", "holdout": 0.2})
    assert split.kind == "bytes" and split.classes == 256
    taken, read = {"train": b"", "held": b""}, 0
    for relative, path in files:  # the loader's own walk, up to its cap
        text = path.read_bytes()
        taken["held" if data.holdout_file(relative, 0.2) else "train"] += text
        read += len(text)
        if read >= data.PYCODE_BYTES:
            break
    assert split.x_train.tobytes() == taken["train"] and split.x_held.tobytes() == taken["held"]
    windows = data.batch(split, [0, 1], 16, family=families.get("llama"))
    assert windows["input_ids"].shape == (2, 16)
    assert (windows["input_ids"][:, 1:] == windows["labels"][:, :-1]).all()  # the next byte


def test_the_family_takes_its_shape_from_the_data(tmp_path):
    conf, arch = validate(composed(*CONVERGE, "data=mnist", "model.patch=7"))
    assert (arch.image_size, arch.num_classes) == (28, 10)
    path = tiny_images(tmp_path / "d.npz")
    conf, arch = validate(composed(*CONVERGE, "data=file", f"data.path={path}", "model.patch=4",
                                   *OWN_TARGET))
    assert (arch.image_size, arch.num_classes) == (8, 3)
    assert "set scenario.metric" in refusal(*CONVERGE, "data=file", f"data.path={path}",
                                            "model.patch=4")  # no default for the user's data
    conf, arch = validate(composed("scenario=converge", "model=llama", "size=tiny",
                                   "data=pycode", "model.vocab_size=1000"))
    assert arch.vocab_size == 256
    import pandas as pd

    table = pd.DataFrame(np.random.default_rng(0).random((40, 16)), columns=[f"p{i}" for i in range(16)])
    table["digit"] = np.arange(40) % 4
    table.to_parquet(tmp_path / "t.parquet")  # flat rows of 16 pixels: 4 x 4 grey images
    conf, arch = validate(composed(*CONVERGE, "data=file", f"data.path={tmp_path}/t.parquet",
                                   "data.label=digit", "model.patch=2", *OWN_TARGET))
    assert (arch.image_size, arch.num_classes) == (4, 4)
    assert "a decoder LM trains on a byte corpus" in refusal(
        "scenario=converge", "model=llama", "size=tiny", "data=mnist")


MNIST1D_VIT = (*CONVERGE, "data=mnist1d", "model.patch=4")


def test_the_vit_takes_mnist1d_signals_as_one_row_images():
    """MNIST-1D's 40 samples are a (1 x 40) image cut into (1 x 4) patches: 10 tokens and the
    class token; torch and JAX build the same parameters (the four-framework run below
    compares all four), the FLOP count follows the patches, square images are as they were."""
    from fxtrack import architectures
    from fxtrack.families import vision
    from fxtrack.frameworks.base import attention_tokens

    conf, arch = validate(composed(*MNIST1D_VIT))
    assert (arch.image_height, arch.image_size, arch.num_classes) == (1, 40, 10)
    assert vision.patch_hw(arch) == (1, 4) and attention_tokens(arch) == 11
    split = data.load(conf.data)
    assert split.kind == "signals" and split.sizes() == {"train": 4000, "held_out": 1000}
    batch = data.batch(split, [0, 5], 1)
    assert batch["images"].shape == (2, 1, 40, 3)
    assert (batch["images"][:, 0, :, 2] == split.x_train[[0, 5]]).all()  # as given, 3 equal channels
    import torch

    from fxtrack.frameworks.jax import models as jax_models
    from fxtrack.frameworks.torch import models as torch_models

    torch_model = torch_models.build(arch)
    assert torch_model(torch.zeros(2, 3, 1, 40)).shape == (2, 10)
    h, mlp = arch.hidden, arch.mlp_dim  # patch conv, class token, 11 positions, block, norm, head
    block = 2 * 2 * h + 4 * h * h + 4 * h + 2 * h * mlp + mlp + h
    expected = 3 * 4 * h + h + h + 11 * h + arch.layers * block + 2 * h + h * 10 + 10
    assert sum(p.numel() for p in torch_model.parameters()) == expected
    import jax
    from flax import nnx

    jax_model = jax_models.build(arch)
    assert sum(x.size for x in jax.tree.leaves(nnx.state(jax_model, nnx.Param))) == expected
    # square images keep their model: the same dims, FLOPs and tokens as before image_height
    square = architectures.resolve("vit", "tiny")
    assert "image_height" not in square.dims and vision.patch_grid(square) == (2, 2)
    assert vision._vit_flops(square) == vision.conv_flops(3, 768, 16, 2) + 2 * (
        vision.encoder_layer_flops(5, 768, 3072)) + 2 * 768 * 1000


def test_bad_data_is_refused_in_one_line_before_any_work(tmp_path):
    file = ("data=file",)
    assert "data.path" in refusal(*CONVERGE, *file)
    assert "is not a readable file" in refusal(*CONVERGE, *file, f"data.path={tmp_path}/none.npz")
    table = tmp_path / "t.csv"
    table.write_text("a,b,c,d,e\n1,2,3,4,0\n5,6,7,8,1\n")
    assert "no label column 'label'" in refusal(*CONVERGE, *file, f"data.path={table}")
    table.write_text("a,b,c,d,label\n1,2,3,4,0.5\n5,6,7,8,1\n")
    assert "labels must be integer class ids" in refusal(*CONVERGE, *file, f"data.path={table}")
    bad = tmp_path / "nan.npz"
    x = np.zeros((8, 4, 4), np.float32)
    x[3, 1, 1] = np.nan
    np.savez(bad, x=x, y=np.zeros(8, int))
    assert "NaN or inf (first in row 3" in refusal(*CONVERGE, *file, f"data.path={bad}")
    small = tiny_images(tmp_path / "s.npz", n=20)
    assert "fewer than one batch of 64" in refusal(*CONVERGE, *file, f"data.path={small}",
                                                    "model.patch=4", "batch_size=64", *OWN_TARGET)
    assert "fewer than one batch of 32" in refusal(*CONVERGE, *file, f"data.path={small}",
                                                    "model.patch=4", *OWN_TARGET)  # the default
    assert "must be divisible by model.patch" in refusal(*CONVERGE, "data=mnist")  # 28 by 16
    assert "trains on synthetic data only" in refusal("scenario=converge", "model=resnet50",
                                                      "size=tiny", "data=mnist1d")
    assert "a masked LM trains on a byte corpus" in refusal("scenario=converge", "model=bert",
                                                            "size=tiny", "data=mnist1d")
    assert "a decoder LM trains on a byte corpus" in refusal(
        "scenario=converge", "model=llama", "size=tiny", "data=mnist1d")
    assert "the ViT takes square images (N, H, W[, C]) or 1-D signals" in refusal(
        *CONVERGE, "data=pycode")
    assert "must be divisible by model.patch (16); the reference runs' dims: model.layers=2 " \
        "model.hidden=64 model.heads=4 model.mlp_dim=128 model.patch=4" in refusal(
            "scenario=converge", "model=vit", "data=mnist1d")  # 40 samples by 16
    assert "outside accuracy's range" in refusal(*CONVERGE, "data=mnist", "model.patch=7",
                                                 "scenario.metric=accuracy", "scenario.target=1.5")
    assert "bits_per_byte has no figure for model family 'vit' (it takes accuracy, loss)" in \
        refusal(*CONVERGE, "data=mnist", "model.patch=7", "scenario.metric=bits_per_byte")
    assert "accuracy has no figure for model family 'llama'" in refusal(
        "scenario=converge", "model=llama", "size=tiny", "data=pycode", "scenario.metric=accuracy")
    assert "trains on real data" in refusal(*CONVERGE)
    two = (*CONVERGE, "data=mnist", "model.patch=7", "devices=2")
    assert "converge_devices" not in refusal(*two, "framework=tensorflow")  # the reason, said:
    assert refusal(*two, "framework=tensorflow").startswith(
        "scenario=converge with devices=2 is not supported by tensorflow: not implemented for "
        "tensorflow yet: its converge step runs outside a tf.distribute strategy")
    assert "is not supported by keras" in refusal(*two, "framework=keras")
    assert "does not divide it; set batch_size to a multiple of 2" in refusal(
        *two, "framework=torch", "batch_size=15")
    assert "runs on one node" in refusal(*CONVERGE, "data=mnist", "model.patch=7",
                                         "framework=torch", "hardware.nodes=2",
                                         "hardware.coordinator=10.0.0.1:29500")
    assert "drop data=mnist" in refusal("scenario=train", "size=tiny", "data=mnist")


def test_time_to_target_and_the_schedule_are_what_they_say():
    history = [{"step": 10, "train_s": 1.0, "value": 0.4}, {"step": 20, "train_s": 2.5, "value": 0.8},
               {"step": 30, "train_s": 3.5, "value": 0.9}]
    assert converge.time_to_target(history, "accuracy", 0.8, 0.5) == {
        "time_to_target_s": 2.0, "steps_to_target": 20}
    assert converge.time_to_target(history, "accuracy", 0.95, 0.5) is None
    assert converge.time_to_target(history, "loss", 0.5, 0.0)["steps_to_target"] == 10
    rates = [converge.lr_at(s, 100, 1e-3, 10) for s in range(100)]
    assert rates[9] == pytest.approx(1e-3) and rates[0] == pytest.approx(1e-4)
    assert rates[-1] < 1e-6 and all(a >= b for a, b in zip(rates[9:], rates[10:]))
    logits = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]]))
    assert converge.score("accuracy", logits, [0, 2]) == (1.0, 2)
    bits, n = converge.score("bits_per_byte", logits, [0, 1])
    assert bits / n == pytest.approx((1.0 + -math.log2(0.8)) / 2)


BERT_PYCODE = ("scenario=converge", "model=bert", "size=tiny", "data=pycode", "model.hidden=16",
               "model.heads=2", "model.mlp_dim=32", "model.seq_len=16")


def test_bert_masks_each_byte_window_by_its_row_and_seed():
    """BERT on data=pycode: vocabulary 257 (the bytes and a [MASK] past them); a window's mask
    is its row's (the same in any batch, epoch or order: every framework gets the same batch),
    another seed masks it otherwise, held-out windows are masked the same for every seed; the
    masked positions (and only those) read [MASK], the labels are the bytes."""
    from fxtrack.families import text

    conf, arch = validate(composed(*BERT_PYCODE))
    assert arch.vocab_size == 257 and text.BYTE_MASK_TOKEN == 256
    split, bert = data.load(conf.data), families.of(arch)
    batch = lambda rows, **kw: data.batch(split, rows, 16, family=bert, **kw)  # noqa: E731
    first, again = batch([3, 7, 11], seed=5), batch([11, 3], seed=5)
    for key in ("input_ids", "mlm_labels", "mlm_weights"):
        assert (first[key][[2, 0]] == again[key]).all(), key
    other = batch([3, 7, 11], seed=6)
    assert (first["mlm_labels"] == other["mlm_labels"]).all()
    assert (first["mlm_weights"] != other["mlm_weights"]).any()  # another seed, another mask
    held = [data.batch(split, [0, 1], 16, held=True, family=bert, seed=s) for s in (0, 9)]
    assert (held[0]["mlm_weights"] == held[1]["mlm_weights"]).all()
    masked = first["mlm_weights"] == 1
    assert (first["input_ids"][masked] == 256).all() and (first["input_ids"][~masked] < 256).all()
    assert (first["mlm_labels"][0] == split.x_train[3 * 16:4 * 16]).all()  # row 3's bytes
    wide = batch(list(range(200)))["mlm_weights"]
    assert wide[:, 0].all() and 0.15 < wide[:, 1:].mean() < 0.2  # text.BERT_MASK_FRACTION
    assert "a masked LM trains on a byte corpus" in refusal("scenario=converge", "model=bert",
                                                            "size=tiny", "data=mnist")


def test_the_held_out_metric_counts_the_masked_positions_only():
    """Logits that are right at the masked positions and wrong elsewhere score 1.0 and 1 bit
    per byte on the masked ones (a weighted-out position would change both)."""
    labels = np.array([[0, 1, 2, 3]])
    weights = np.array([[1.0, 0.0, 1.0, 0.0]])
    logits = np.full((1, 4, 4), -30.0)
    logits[0, [0, 2], [0, 2]] = 0.0  # right at positions 0 and 2 ...
    logits[0, [1, 3], [0, 0]] = 0.0  # ... wrong at 1 and 3
    assert converge.score("accuracy", logits, labels, weights) == (2.0, 2)
    assert converge.score("accuracy", logits, labels) == (2.0, 4)
    half = np.log(np.full((1, 4, 4), 0.25))
    half[0, 0] = np.log([0.5, 0.5 / 3, 0.5 / 3, 0.5 / 3])  # position 0: p = 1/2, 1 bit
    bits, n = converge.score("bits_per_byte", half, labels, weights)
    assert n == 2 and bits == pytest.approx(1.0 + 2.0)  # 1 bit and 2 bits, not 2 + 2 + 2
    batch = {"mlm_labels": labels, "mlm_weights": weights, "input_ids": labels}
    assert data.targets(batch)[1] is weights and data.targets({"labels": labels})[1] is None


def converge_spec(spec_factory, path: Path, **options):
    """A torch converge JobSpec on the tiny data=file set at ``path``."""
    dims = dict(image_size=8, num_classes=3, patch=4, layers=1, hidden=16, heads=2, mlp_dim=32)
    return spec_factory("torch", "vit", scenario="converge",
                        runner="fxtrack.scenarios.converge.runner:run", batch_size=16, arch=dims,
                        data={"name": "file", "path": str(path), "label": "label",
                              "holdout": 0.2},
                        options={"metric": "accuracy", "target": 1.0, "max_epochs": 2,
                                 "eval_every": 100, "lr": 1e-2, **options})


def test_a_planted_optimizer_difference_fails_the_trajectory_check(spec_factory, monkeypatch,
                                                                   tmp_path):
    """Two torch runs from the same start: equal losses match; another AdamW eps in one of
    them (a planted optimizer difference) diverges, and the check says at which step."""
    from fxtrack.frameworks.base import ADAMW
    from fxtrack.worker.__main__ import run

    path = tiny_images(tmp_path / "d.npz")

    def losses() -> list[float]:
        result = run(converge_spec(spec_factory, path))
        assert result.status == "FINISHED", result.error
        return result.series["loss"][:8]

    reference = losses()
    assert converge.trajectory(losses(), reference, 1e-6) == (0.0, "matched")
    monkeypatch.setitem(ADAMW, "eps", 1e-1)
    worst, tag = converge.trajectory(losses(), reference, 1e-4)
    assert tag.startswith("diverged@") and int(tag.split("@")[1]) >= 2  # step 1's loss is the
    assert worst > 1e-4  # same start's: only the update differs


def test_a_missed_target_is_a_finished_run_that_says_so(spec_factory, tmp_path):
    from fxtrack.worker.__main__ import run

    result = run(converge_spec(spec_factory, tiny_images(tmp_path / "d.npz"), eval_every=2))
    m = result.metrics
    assert result.status == "FINISHED" and result.error is None and m["reached_target"] == 0.0
    assert "time_to_target_s" not in m and m["final_eval_accuracy"] < 1.0
    assert m["steps_trained"] == 2 * (76 // 16)  # the whole budget: 96 rows, 20 held out
    assert result.series_steps["eval_accuracy"] == [2, 4, 6, 8]


def converge_runs(cwd):
    """(client, {framework: its converge run}) of the embedded store in ``cwd``: one per
    framework, all four there."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{cwd}/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.`fxtrack.scenario` = 'converge'")
    runs = {r.data.tags["fxtrack.framework"]: r for r in runs if "reached_target" in r.data.metrics}
    assert sorted(runs) == ["jax", "keras", "tensorflow", "torch"]
    return client, runs


@pytest.fixture(scope="module")
def converge_sweep(tmp_path_factory):
    """One sweep of the four frameworks on a tiny data=file set to a reachable target."""
    cwd = tmp_path_factory.mktemp("converge")
    path = tiny_images(cwd / "d.npz", n=200)
    done = run_fxtrack(cwd, "-m", *CONVERGE, "framework=torch,jax,tensorflow,keras", "data=file",
                       f"data.path={path}", "model.patch=4", "batch_size=16",
                       "scenario.metric=accuracy", "scenario.target=0.6",
                       "scenario.max_epochs=2", "scenario.eval_every=2", "scenario.lr=1e-2",
                       env=seed_peak_cache(cwd / "cache"), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    client, runs = converge_runs(cwd)
    return client, runs, cwd


def test_time_to_target_is_recomputed_from_the_logged_eval_history(converge_sweep):
    client, runs, _ = converge_sweep
    for framework, run in runs.items():
        m = run.data.metrics
        assert m["reached_target"] == 1.0, framework
        history = client.get_metric_history(run.info.run_id, "eval_accuracy")
        train_s = {p.step: p.value for p in client.get_metric_history(run.info.run_id,
                                                                      "eval_train_s")}
        first = min(p.step for p in history if p.value >= 0.6)
        assert m["steps_to_target"] == first and m["samples_to_target"] == first * 16
        assert m["time_to_target_s"] == pytest.approx(train_s[first])
        # the training steps' host load and its caveat, as every scenario's timed work
        assert "host_other_cpu_frac" in m and run.data.tags["fxtrack.contended"] in ("true", "false")
    # one file, one digest: the runs are one experiment wherever the file lies
    assert len({r.data.tags["fxtrack.data_digest"] for r in runs.values()}) == 1
    dataset = runs["torch"].inputs.dataset_inputs[0].dataset
    assert dataset.name == "data-file" and json.loads(dataset.profile) == {"train": 160,
                                                                           "held_out": 40}


def test_every_framework_starts_where_the_first_did(converge_sweep):
    """The same start (fxtrack.frameworks.initial), batch order and optimiser: at fp32 the
    first training losses of jax, tensorflow and keras match torch's, the sweep's first."""
    _, runs, _ = converge_sweep
    assert runs["torch"].data.tags["fxtrack.trajectory"] == "reference"
    for framework in ("jax", "tensorflow", "keras"):
        tags, m = runs[framework].data.tags, runs[framework].data.metrics
        assert tags["fxtrack.trajectory"] == "matched", (framework, m["loss_divergence_max"])
        assert tags["fxtrack.trajectory_reference"] == "torch"


@pytest.mark.slow  # two frameworks x two parallel modes on two devices: about 35 s
def test_two_devices_split_the_batch_and_keep_the_single_device_trajectory(converge_sweep,
                                                                          tmp_path):
    """devices=2 (torch: two torchrun ranks; JAX: one process, a two-device mesh), DDP and
    FSDP: the same global batch split over the devices, the shared start given to replicated
    or sharded parameters; every loss equals the single-device torch run's of the sweep above,
    and FSDP's run is compared with the DDP baseline of its own framework."""
    sweep_client, runs, cwd = converge_sweep
    done = run_fxtrack(tmp_path, "-m", *CONVERGE, "framework=torch,jax", "devices=2",
                       "parallel=ddp,fsdp", "data=file", f"data.path={cwd / 'd.npz'}",
                       "model.patch=4", "batch_size=16", "scenario.metric=accuracy",
                       "scenario.target=0.6", "scenario.max_epochs=2", "scenario.eval_every=2",
                       "scenario.lr=1e-2", env=seed_peak_cache(tmp_path / "cache"), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    two = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()],
                                         "tags.`fxtrack.scenario` = 'converge'")
           if "reached_target" in r.data.metrics]

    def losses(run, store=client):
        return [p.value for p in sorted(store.get_metric_history(run.info.run_id, "loss"),
                                        key=lambda p: p.step)]

    one = runs["torch"]
    reference = losses(one, sweep_client)
    assert len(reference) >= 4
    assert sorted((r.data.tags["fxtrack.framework"], r.data.params["parallel"]) for r in two) == [
        ("jax", "ddp"), ("jax", "fsdp"), ("torch", "ddp"), ("torch", "fsdp")]
    for run in two:
        what = (run.data.tags["fxtrack.framework"], run.data.params["parallel"])
        assert run.info.status == "FINISHED" and run.data.params["devices"] == "2", what
        assert losses(run) == pytest.approx(reference, rel=1e-5), what
        m = run.data.metrics
        assert m["steps_to_target"] == one.data.metrics["steps_to_target"], what
        assert m["param_count"] == one.data.metrics["param_count"], what
        if what[1] == "fsdp":  # the lever against its framework's ddp run on two devices
            assert run.data.tags["fxtrack.lever_quality"] == "kept", what
            assert "final_eval_vs_fp32" in m, what


def test_each_torch_rank_trains_on_its_own_slice_of_the_global_batch(monkeypatch):
    """Under torchrun, rank r of w takes rows [r*B/w, (r+1)*B/w) of the host batch (DDP's
    averaged gradients would hide a rank that trained on every row)."""
    pytest.importorskip("torch")
    from fxtrack.frameworks.torch import converge as torch_converge
    from fxtrack.frameworks.torch import parallel

    seen = []

    class Backend:  # what train_on_host reads: a built model, optimiser and step
        same_start = True
        opt = type("Opt", (), {"param_groups": [{}]})()
        model = type("Model", (), {"train": lambda self: None})()

        def train_on(self, batch):
            seen.append(batch["input_ids"][:, 0].tolist())
            return 0.0

    monkeypatch.setattr(torch_converge, "_on_device", lambda backend, batch: batch)
    monkeypatch.setattr(parallel, "mean_over_ranks", lambda value: value)
    rows = {"input_ids": np.arange(8)[:, None].repeat(3, 1)}
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        torch_converge.train_on_host(Backend(), rows, 1e-3)
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_the_report_has_a_time_to_quality_section_and_chart(converge_sweep):
    cwd = converge_sweep[2]
    # one report, every format (md, html, csv): the page, its chart and the html block at once
    done = report_here(cwd, "--out", str(cwd / "report"))
    assert done.returncode == 0, done.stderr[-2000:]
    page = (cwd / "report" / "report.md").read_text()
    # titled by the dims that ran and the user's file by its content digest
    assert re.search(r"### Time to quality: vit tiny \(.*\) on data=file \([0-9a-f]{8}\), "
                     r"target 0.6 \(fp32, cpu\)", page), page
    assert "1 run(s): needs repeats=5" in page  # single runs: no verdict, said why
    (chart,) = (cwd / "report").glob("converge_*.png")
    assert chart.stat().st_size > 10_000
    assert "(time to quality, batch" in (cwd / "report" / "index.html").read_text()  # its block


def test_a_lever_is_compared_with_its_frameworks_fp32_run(spec_factory):
    """bf16 against the same framework's fp32 run earlier in the sweep: kept within
    scenario.quality_tol, lost beyond it; no baseline said so."""
    from fxtrack.worker.protocol import Result

    held: dict = {}
    options = {"metric": "accuracy", "target": 0.8, "quality_tol": 0.02}

    def checked(precision: str, final: float, seconds: float, framework: str = "torch") -> Result:
        spec = spec_factory(framework, "vit", scenario="converge", precision=precision,
                            compile_request="auto", options=options,
                            data={"name": "mnist", "holdout": 0.2})
        result = Result("r", resolved={"metric": "accuracy", "batch_size": 8},
                        series={"loss": [2.3, 2.2]},
                        metrics={"final_eval_accuracy": final, "time_to_target_s": seconds})
        converge_check.cross_check(result, spec, held)
        return result

    assert "lever_quality" not in checked("fp32", 0.90, 10.0).tags  # the baseline itself
    kept = checked("bf16", 0.89, 5.0)
    assert kept.tags["lever_quality"] == "kept"
    assert kept.metrics["final_eval_vs_fp32"] == pytest.approx(-0.01)
    assert kept.metrics["time_to_target_x_fp32"] == pytest.approx(0.5)
    assert checked("bf16", 0.85, 5.0).tags["lever_quality"] == "lost"
    assert checked("bf16", 0.9, 5.0, "jax").tags["lever_quality"] == "no fp32 baseline"


def test_the_report_keeps_mlperfs_rules():
    from fxtrack.scenarios.converge.section import middle

    assert middle([3.0, 1.0, 2.0, None]) == (None, "4 run(s): needs repeats=5")
    assert middle([5.0, 1.0, 2.0, 3.0, None]) == ([2.0, 3.0, 5.0], "")  # a miss is the slowest
    assert middle([5.0, None, 2.0, 3.0, None])[1] == "1 of the kept runs missed the target"


def test_the_time_to_quality_section_counts_runs_and_gives_a_ratio_with_its_interval():
    from fxtrack.scenarios.converge.section import section
    from tests.test_figures import Generator, search_frame

    g = Generator(0)
    g.rng.random = lambda: 0.99  # no caveats
    for fw, times in (("jax", [1.0, 1.1, 0.9, 1.2, 1.0]), ("torch", [2.0, 2.2, 1.9, 2.1, 2.0])):
        g.group(fw, "converge", {"data.name": "mnist", "scenario.target": "0.8"}, times,
                "time_to_target_s", {"reached_target": 1.0, "final_eval_accuracy": 0.8})
    frame = search_frame(g.runs)  # a repeats=5 aggregate each: its repeats pool, it does not
    table = section(None, frame).tables[0]
    jax, torch = table.rows
    assert jax[:3] == ["jax", "5", "5"] and jax[5] == "fastest"
    assert torch[5].startswith("1.97x [")  # (2.0 + 2.1 + 2.0) / (1.0 + 1.1 + 1.0)


def test_a_framework_needing_more_steps_is_flagged_and_the_matching_one_same():
    """Sample efficiency apart from step speed: from the same start the step counts agree; a
    framework handed another learning rate needs more of them, and the page says which share
    of its time difference that is."""
    from fxtrack.scenarios.converge.section import section
    from tests.test_figures import Generator, search_frame

    g = Generator(0)
    g.rng.random = lambda: 0.99
    plan = {"torch": (1.0, 100), "jax": (1.2, 100), "tensorflow": (2.0, 150)}  # s/step-ish, steps
    for fw, (slow, steps) in plan.items():
        jitter = [1.0, 1.02, 0.98, 1.01, 0.99]
        g.group(fw, "converge", {"data.name": "mnist", "scenario.target": "0.8"},
                [slow * steps / 100 * j for j in jitter], "time_to_target_s",
                {"reached_target": 1.0})
        for run, j in zip([r for r in g.runs if r.tags["fxtrack.framework"] == fw
                           and r.tags.get("fxtrack.kind") != "aggregate"], jitter):
            run.metrics["steps_to_target"] = round(steps * j)
    table = section(None, search_frame(g.runs)).tables[0]
    rows = {r[0]: r for r in table.rows}
    assert rows["torch"][6] == "-"  # the fastest: the reference
    assert rows["jax"][6].startswith("same: 1.00x steps [")
    assert rows["tensorflow"][6].startswith("more_steps: 1.50x steps [")
    words = " ".join(table.notes)
    assert "tensorflow: 3.00x the time of torch, 1.50x its steps: 37% of the difference" in words


def test_the_answer_reads_time_to_quality_by_mlperfs_rule_as_the_section_does():
    """The answer page's time-to-quality figure stands on the runs MLPerf's rule keeps (the
    objective's repeats_rule): the mean of the middle three of five, with their interval; fewer
    than five runs give a median with no interval (no verdict)."""
    import pandas as pd

    from fxtrack import scenarios
    from fxtrack.report import samples
    from fxtrack.scenarios.converge.section import middle

    (objective,) = scenarios.get("converge").objectives
    assert scenarios.get("converge").part("section", objective.repeats_rule) is middle
    times = [1.0, 1.1, 0.9, 5.0, None]  # a slow outlier and a missed target: both dropped
    agg = {"run_id": "a", "result_id": "agg", "repeat_of": None, "kind": "aggregate",
           "metrics.time_to_target_s": 1.1}
    reps = [{"run_id": f"r{i}", "result_id": f"r{i}", "repeat_of": "agg", "kind": None,
             "metrics.time_to_target_s": t} for i, t in enumerate(times)]
    runs = pd.DataFrame([agg, *reps])
    group = runs.iloc[[0]]
    plain = samples.sample(group, runs, "time_to_target_s")
    ruled = samples.sample(group, runs, "time_to_target_s", middle)
    assert plain.point == pytest.approx(1.05)  # every finished repeat's median, the outlier in
    assert ruled.point == pytest.approx((1.0 + 1.1 + 5.0) / 3) and ruled.n == 5
    assert ruled.interval() is not None
    few = pd.DataFrame([agg, *reps[:3]])
    short = samples.sample(few.iloc[[0]], few, "time_to_target_s", middle)
    assert short.point == pytest.approx(1.0) and short.interval() is None


def matched_short_runs(cwd: Path, *overrides: str) -> dict:
    """A short converge sweep of the four frameworks in ``cwd`` (8 steps, batch 16, the first 8
    losses checked): every run FINISHED with torch's parameter count, torch the trajectory
    reference and the others ``matched``; returns {framework: run}."""
    done = run_fxtrack(cwd, "-m", *overrides, "framework=torch,jax,tensorflow,keras",
                       "batch_size=16", "scenario.max_steps=8", "scenario.trajectory_steps=8",
                       env=seed_peak_cache(cwd / "cache"), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    _, runs = converge_runs(cwd)
    counts = {fw: r.data.metrics["param_count"] for fw, r in runs.items()}
    assert len(set(counts.values())) == 1, counts
    assert runs["torch"].data.tags["fxtrack.trajectory"] == "reference"
    for framework in ("jax", "tensorflow", "keras"):
        tags, m = runs[framework].data.tags, runs[framework].data.metrics
        assert tags["fxtrack.trajectory"] == "matched", (framework, m["loss_divergence_max"])
        assert runs[framework].info.status == "FINISHED"
    return runs


@pytest.mark.slow
def test_a_short_mnist1d_run_matches_torchs_start_in_every_framework(tmp_path):
    """A few steps of the tiny ViT on MNIST-1D in the four frameworks, to an easy target: each
    run finishes with the parameter count of torch's model, and jax, tensorflow and keras
    start where torch did (the trajectory check's ``matched``). Four workers' start-up: about
    a minute of CPU on 2 cores (128 s wall on the shared machine), hence ``slow``."""
    runs = matched_short_runs(tmp_path, *MNIST1D_VIT, "scenario.eval_every=4",
                              "scenario.eval_samples=200", "scenario.target=0.15")
    assert runs["torch"].data.params["data.name"] == "mnist1d"


def test_every_declared_default_names_the_docs_section_of_its_reference_runs():
    """A family's converge defaults (fxtrack.families.quality) link the runs that set them."""
    import re

    from fxtrack import families
    from tests.test_docs import ROOT, _anchor

    for family in families.names():
        for name, declared in families.get(family).quality.items():
            path, _, anchor = declared.reference.partition("#")
            headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), re.MULTILINE)
            assert anchor in {_anchor(h) for h in headings}, (family, name, declared.reference)


@pytest.mark.slow
def test_a_short_bert_pycode_run_matches_torchs_start_in_every_framework(tmp_path):
    """A few steps of a tiny BERT on the standard library's bytes in the four frameworks: each
    run has torch's parameter count (vocabulary 257) and jax, tensorflow and keras start where
    torch did (``matched``), their held-out bits per masked byte within 1e-3 of torch's. Four
    workers' start-up: about 35 s on 2 cores, hence ``slow``."""
    runs = matched_short_runs(tmp_path, *BERT_PYCODE, "scenario.eval_every=8",
                              "scenario.eval_samples=64")
    reference = runs["torch"].data.metrics["final_eval_bits_per_byte"]
    for framework in ("jax", "tensorflow", "keras"):
        m = runs[framework].data.metrics
        assert m["final_eval_bits_per_byte"] == pytest.approx(reference, rel=1e-3), framework
    assert runs["torch"].data.params["data.name"] == "pycode"
