"""The Keras Llama (fxtrack.frameworks.keras_models.Llama) on framework=tensorflow, CPU, tiny
sizes: its logits equal Hugging Face's LlamaForCausalLM's after copying the weights (tied and
untied output projection), its cached greedy decode gives HF's greedy ``generate`` tokens (plain
tf.function and XLA), and worker runs of scenario=train and scenario=generate finish with a
falling loss and the cache guard ok; bf16 keeps fp32 weights. (framework=keras trains and
generates it in tests/test_keras.py; the full-size parameter counts are in
tests/test_tensorflow.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from conftest import tiny_arch  # noqa: E402
from convert_tensorflow import copy_hf_llama_to_keras  # noqa: E402
from fxtrack.architectures import Arch  # noqa: E402
from fxtrack.frameworks import keras_models as models  # noqa: E402
from fxtrack.frameworks.tensorflow import generate  # noqa: E402
from fxtrack.frameworks.tensorflow.backend import TensorFlowBackend  # noqa: E402
from fxtrack.worker.__main__ import run as worker_run  # noqa: E402

PROMPT, NEW, BATCH = 8, 8, 2


def hf_llama(arch: Arch, seed: int = 0):
    """Hugging Face's LlamaForCausalLM with ``arch``'s dims, fp32, eager attention, built from a
    local config (nothing downloaded), weights drawn from ``seed``."""
    config = transformers.LlamaConfig(
        vocab_size=arch.vocab_size, hidden_size=arch.hidden, intermediate_size=arch.mlp_dim,
        num_hidden_layers=arch.layers, num_attention_heads=arch.heads,
        num_key_value_heads=arch.kv_heads, max_position_embeddings=4 * arch.seq_len,
        rms_norm_eps=arch.norm_eps, rope_theta=arch.rope_theta,
        tie_word_embeddings=bool(arch.tied_embeddings), attention_bias=False, mlp_bias=False,
        pad_token_id=0, bos_token_id=None, eos_token_id=None)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).float().eval()
    # HF's init leaves the norms at 1: perturb them so the parity also checks their use
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _ids(arch: Arch, batch: int, length: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, arch.vocab_size, (batch, length)).astype(np.int32)


@pytest.mark.parametrize("name", ["llama", "llama_8b"])  # tied, untied output projection
def test_logits_match_hugging_face(name):
    arch = tiny_arch(name)
    hf = hf_llama(arch)
    km = models.build(arch)
    copy_hf_llama_to_keras(hf, km, arch)
    ids = _ids(arch, 3, arch.seq_len)
    with torch.no_grad():
        expected = hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    got = km(ids, training=False).numpy()
    assert got.shape == expected.shape == (3, arch.seq_len, arch.vocab_size)
    err = np.max(np.abs(got - expected)) / np.max(np.abs(expected))
    assert err < 1e-4, err
    # and the tied / untied projection really is what the table says
    assert len(km.trainable_variables) == 2 + 9 * arch.layers + int(not arch.tied_embeddings)


@pytest.fixture
def tf_backend(spec_factory):
    def make(compile: bool) -> TensorFlowBackend:
        backend = TensorFlowBackend(spec_factory("tensorflow", "llama", batch_size=BATCH,
                                                 compile=compile))
        backend.device_kind()
        backend.build(BATCH)
        return backend

    return make


@pytest.mark.parametrize("compile", [False, True], ids=["tf.function", "xla"])
def test_cached_greedy_decode_gives_hugging_face_tokens(tf_backend, compile):
    backend = tf_backend(compile)
    arch = backend.arch
    hf = hf_llama(arch, seed=2)
    copy_hf_llama_to_keras(hf, backend.model, arch)
    prompt = _ids(arch, BATCH, PROMPT, seed=3)
    with torch.no_grad():
        out = hf.generate(torch.tensor(prompt, dtype=torch.long),
                          attention_mask=torch.ones(prompt.shape, dtype=torch.long),
                          do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW)
    expected = out[:, PROMPT:].numpy()
    decoder = generate.prepare(backend, PROMPT, NEW)
    for _ in range(2):  # the second generation starts afresh over the same cache
        token = decoder.prefill(prompt)
        got = [decoder.tokens(token)]
        for _ in range(NEW - 1):
            token = decoder.step(token)
            got.append(decoder.tokens(token))
        np.testing.assert_array_equal(np.stack(got, axis=1), expected)
    np.testing.assert_array_equal(decoder.uncached(prompt, NEW), expected)
    block = backend.model.blocks[0]
    assert decoder.cache_bytes() == (arch.layers * 2 * BATCH * (PROMPT + NEW) * block.kv_heads
                                     * block.head_dim * 4)


def test_train_worker_run_loss_falls(spec_factory):
    result = worker_run(spec_factory("tensorflow", "llama", steps=19, warmup_steps=1))
    assert result.status == "FINISHED", result.error
    losses = result.series["loss"]
    assert len(losses) == 20 and all(math.isfinite(x) for x in losses)
    # AdamW at BERT's 1e-4 from N(0, 0.02) weights: a steady fall, 6% in 19 steps (measured)
    assert losses[-1] < 0.95 * losses[0] and max(losses[1:]) < losses[0], losses
    assert result.guard == "ok", result.guard
    assert result.tags["attention"] == "keras.ops.dot_product_attention:composite:causal:gqa-kv-repeated"


def test_generate_worker_run(spec_factory):
    result = worker_run(spec_factory("tensorflow", "llama", scenario="generate",
                                     runner="fxtrack.scenarios.generate.runner:run", steps=2,
                                     options={"prompt_len": PROMPT, "new_tokens": NEW}))
    assert result.status == "FINISHED", result.error
    assert result.guard == "ok", result.guard
    m = result.metrics
    for key in ("ttft_ms_p50", "ttft_ms_p90", "decode_ms_per_token_p50",
                "decode_ms_per_token_p90", "decode_tokens_per_s", "tokens_per_s"):
        assert m[key] > 0, key
    arch = tiny_arch("llama")
    head_dim = arch.hidden // arch.heads
    assert m["kv_cache_mib"] * 2**20 == arch.layers * 2 * BATCH * (PROMPT + NEW) * arch.kv_heads * head_dim * 4
    assert len(result.series["decode_ms_per_token"]) == NEW - 1


def test_bf16_computes_every_matmul_in_bf16_with_fp32_weights():
    """Under mixed_bfloat16 the output projection too runs in bf16 (Keras' ReversibleEmbedding
    would otherwise multiply by the fp32 embedding in fp32), the weights stay fp32."""
    from fxtrack.frameworks.keras_train import precision_policy

    for arch in (tiny_arch("llama"), tiny_arch("llama_8b")):  # tied, untied (hidden, vocab)
        with precision_policy("bf16"):
            km = models.build(arch)
        assert km(_ids(arch, 2, 8)).dtype == tf.bfloat16
        assert {v.dtype for v in km.weights} == {"float32"}
