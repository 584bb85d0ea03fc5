"""Issue 43 case 9: one part costs only itself. scenario=checkpoint on a Hugging Face T5
(model=custom, built from a local config) failed as a whole because torch.export meets the
model's EncoderDecoderCache among its outputs. The save / restore / replay are measured and
the export is refused with the exporter's reason, in a tag."""

from __future__ import annotations

import pytest
from conftest import job_spec


def build_t5(batch_size: int, seed: int, seq_len: int = 8, vocab: int = 64):
    """A tiny T5 with its cache on (transformers' default): its outputs carry a cache object."""
    import torch
    import torch.nn.functional as F
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(vocab_size=vocab, d_model=16, d_kv=8, d_ff=32, num_layers=1,
                      num_decoder_layers=1, num_heads=2, dropout_rate=0.0,
                      decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(config)
    generator = torch.Generator().manual_seed(seed)
    source = torch.randint(1, vocab, (batch_size, seq_len), generator=generator)
    target = torch.randint(1, vocab, (batch_size, seq_len + 1), generator=generator)

    def loss(out, targets):  # out: Seq2SeqLMOutput (its past_key_values an EncoderDecoderCache)
        return F.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten())

    return model, ({"input_ids": source, "decoder_input_ids": target[:, :-1]}, target[:, 1:]), loss


def test_a_t5_checkpoint_stands_and_its_export_is_refused_with_the_reason(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fxtrack.worker.__main__ import prepare_environment, run

    spec = job_spec("torch", "custom", tmp_path, arch={"torch": f"{__name__}:build_t5"},
                    batch_size=2, steps=2, scenario="checkpoint",
                    runner="fxtrack.scenarios.checkpoint.runner:run")
    prepare_environment(spec)
    result = run(spec)
    assert result.status == "FINISHED", result.error
    m = result.metrics
    assert m["checkpoint_save_s"] > 0 and m["checkpoint_mib"] > 0
    assert m["checkpoint_restore_exact"] == 1.0 and result.guard == "ok"
    why = result.tags["export_not_supported"]
    assert why and "\n" not in why
    assert not {"export_s", "export_mib", "export_latency_ratio"} & set(m)
