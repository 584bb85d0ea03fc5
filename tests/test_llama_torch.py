"""model=llama in PyTorch at tiny size: logits and greedy generation equal Hugging Face's
LlamaForCausalLM with the same weights (the FLOP convention: tests/test_torch.py), training and
scenario=generate through the worker, and fsdp / remat on 2 CPU ranks."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fxtrack import architectures  # noqa: E402
from fxtrack.frameworks.torch import generate, models  # noqa: E402
from fxtrack.worker.__main__ import run  # noqa: E402
from conftest import SLOT_PROMPTS, backend_class, drive_slots, job_spec  # noqa: E402
from convert_llama import hf_reference, hf_state_numpy, to_torch  # noqa: E402

GENERATE = dict(scenario="generate", runner="fxtrack.scenarios.generate.runner:run",
                options={"prompt_len": 8, "new_tokens": 8})


def _tiny(**dims) -> architectures.Arch:
    return architectures.resolve("llama", "tiny", **dims)


@pytest.mark.parametrize("tied", [True, False])
def test_logits_equal_hugging_face_llama(tied):
    arch = _tiny(tied_embeddings=tied)
    reference = hf_reference(arch, seed=0)
    torch.manual_seed(1)  # different init: only the copy can make them agree
    net = models.build(arch).eval()
    to_torch(hf_state_numpy(reference), net)
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, arch.vocab_size, (2, arch.seq_len)))
    with torch.no_grad():
        ours, theirs = net(ids), reference(ids).logits
    assert ours.shape == theirs.shape == (2, arch.seq_len, arch.vocab_size)
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0), float((ours - theirs).abs().max())
    assert sum(p.numel() for p in net.parameters()) == architectures.llama_params(arch)["total"]


def test_training_run_loss_falls(spec_factory):
    result = run(spec_factory("torch", "llama", steps=19, warmup_steps=1))
    assert result.status == "FINISHED", result.error
    losses = result.series["loss"]
    assert len(losses) == 20 and all(math.isfinite(x) for x in losses)
    assert losses[0] == pytest.approx(math.log(256), rel=0.05)  # a fresh model: ~uniform over vocab
    assert losses[-1] < losses[0] - 0.2
    assert result.guard == "ok"
    assert result.tags["attention"].startswith("sdpa")


def test_generate_run_reports_decode_figures(spec_factory):
    result = run(spec_factory("torch", "llama", **GENERATE))
    assert result.status == "FINISHED", result.error
    assert result.guard == "ok"  # the cached decode gave the uncached forward's tokens
    m, arch = result.metrics, architectures.resolve("llama", "tiny")
    for key in ("ttft_ms_p50", "decode_ms_per_token_p50", "decode_tokens_per_s"):
        assert m[key] > 0, key
    hd = arch.hidden // arch.heads
    assert m["kv_cache_mib"] * 2**20 == 2 * arch.layers * 2 * arch.kv_heads * (8 + 8) * hd * 4
    assert result.tags["attention"].startswith("sdpa")
    # fxtrack's untrained tied weights repeat the prompt's last token: the run says its guard
    # proved little (the parity tests below carry the proof)
    assert result.tags["generate_guard"].startswith("weak")


def _decoder(arch: architectures.Arch, prompt_len: int = 8, new_tokens: int = 8, **spec_fields):
    """The worker's backend and its decoder, with the weights of Hugging Face's reference (std
    0.2: hf_reference says why) copied in."""
    reference, backend = _backend(arch, **spec_fields)
    return reference, generate.prepare(backend, prompt_len, new_tokens)


def _backend(arch: architectures.Arch, **spec_fields):
    """The worker's backend built at batch 2 with Hugging Face's reference weights."""
    reference = hf_reference(arch, seed=0, std=0.2)
    spec = job_spec("torch", "llama", arch=dict(tied_embeddings=arch.tied_embeddings),
                    **GENERATE, **spec_fields)
    backend = backend_class(spec)(spec)
    backend.device_kind()
    backend.build(2)
    to_torch(hf_state_numpy(reference), backend.model)
    return reference, backend


def _greedy(decoder, prompt: np.ndarray, new_tokens: int, lose_cache: bool = False) -> np.ndarray:
    token = decoder.prefill(prompt)
    out = [decoder.tokens(token)]
    if lose_cache:  # what a decode step that did not read back the prefill's K/V would see
        for kv in decoder.cache:
            for t in kv:
                t.zero_()
    for _ in range(new_tokens - 1):
        token = decoder.step(token)
        out.append(decoder.tokens(token))
    return np.stack(out, axis=1)


def _prompt(arch: architectures.Arch) -> np.ndarray:
    return np.random.default_rng(3).integers(0, arch.vocab_size, (2, 8)).astype(np.int32)


@pytest.mark.parametrize("tied", [True, False])
def test_cached_decode_equals_hugging_face_greedy_generate(tied):
    """The generation parity the other frameworks compare against too: HF's own greedy
    ``generate`` (its dynamic cache) over the same weights."""
    arch = _tiny(tied_embeddings=tied)
    reference, decoder = _decoder(arch)
    prompt = _prompt(arch)
    ids = torch.from_numpy(prompt).long()
    expected = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                                  do_sample=False)[:, 8:].numpy()
    assert expected.shape == (2, 8)
    assert len(np.unique(expected)) > 4  # tokens that depend on the context, not one repeated
    np.testing.assert_array_equal(_greedy(decoder, prompt, 8), expected)
    np.testing.assert_array_equal(_greedy(decoder, prompt, 8), expected)  # the cache is reused
    np.testing.assert_array_equal(decoder.uncached(prompt, 8), expected)


def test_a_lost_cache_fails_the_guard():
    """The guard has teeth: decode steps over a wiped cache attend to zeros and diverge."""
    from fxtrack.scenarios.generate.runner import cache_guard

    arch = architectures.resolve("llama", "tiny")
    _, decoder = _decoder(arch)
    prompt = _prompt(arch)
    lost = _greedy(decoder, prompt, 8, lose_cache=True)
    assert cache_guard(lost, decoder.uncached(prompt, 8)).startswith("cached decode differs")


@pytest.mark.slow
def test_fsdp_shards_llama_and_keeps_the_math():
    from test_memory_levers import TOL, ranks

    ddp = ranks("torch", "llama", "ddp", "none", 29571)
    fsdp = ranks("torch", "llama", "fsdp", "none", 29572)
    for rank, shard in fsdp.items():
        assert shard["total"] == ddp[rank]["total"] == ddp[rank]["local"]
        assert shard["local"] == pytest.approx(shard["total"] / 2, rel=0.01)
        assert shard["state_bytes"] == pytest.approx(ddp[rank]["state_bytes"] / 2, rel=0.01)
        assert shard["losses"] == pytest.approx(ddp[rank]["losses"], abs=TOL)
        assert shard["losses"][-1] < shard["losses"][0]


@pytest.mark.slow
def test_remat_on_two_ranks_matches_none():
    from test_memory_levers import TOL, ranks

    none = ranks("torch", "llama", "ddp", "none", 29571)  # cached: the fsdp test's baseline
    remat = ranks("torch", "llama", "ddp", "checkpoint", 29573)
    for rank, line in remat.items():
        assert line["losses"] == pytest.approx(none[rank]["losses"], abs=TOL)


def test_compiled_decode_captures_whole_and_never_recompiles(monkeypatch):
    """framework.compile=true (the GPU's rule) on a CPU: dynamo must capture prefill and step as
    one graph each (fullgraph) and the static cache must keep the step from recompiling as the
    position moves; aot_eager stands in for inductor (the capture is the same, the C++ build
    minutes are not)."""
    import functools

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    monkeypatch.setattr(torch._dynamo.config, "error_on_recompile", True)
    torch._dynamo.reset()
    arch = architectures.resolve("llama", "tiny")
    _, decoder = _decoder(arch, compile=True)
    assert decoder._step != decoder._step_fn  # the compiled wrapper, not the eager method
    prompt = _prompt(arch)
    expected = decoder.uncached(prompt, 8)
    np.testing.assert_array_equal(_greedy(decoder, prompt, 8), expected)
    np.testing.assert_array_equal(_greedy(decoder, prompt, 8), expected)
    torch._dynamo.reset()


def test_continuous_slots_decode_each_request_as_its_own_greedy_run():
    """scenario.batching=continuous's slots (fxtrack.frameworks.torch.slots): requests of
    different prompt lengths (padded to their buckets) admitted while others decode, a freed
    slot reused, each request's tokens equal to an uncached greedy run of its own prompt."""
    from fxtrack.frameworks.torch import slots as torch_slots

    _, backend = _backend(_tiny())  # the reference's weights: greedy tokens vary
    slots = torch_slots.prepare_slots(backend, 2, prompt_buckets=[16, 20], longest=6)
    assert slots.buckets == [16, 20]
    got = drive_slots(slots)
    with torch.inference_mode():
        for name, tokens in got.items():
            # the slots keep the seeded prompt on the host (the output check reads it there)
            seq = torch.from_numpy(slots.ids[:, :SLOT_PROMPTS[name]]).to(backend.device)
            want = []
            for _ in range(len(tokens)):
                token = backend.model(seq)[:, -1].argmax(-1)
                want.append(int(token))
                seq = torch.cat([seq, token[:, None]], dim=1)
            assert tokens == want, name
    assert len(set(got["a"] + got["b"])) > 2  # not one repeated token: the check can fail
