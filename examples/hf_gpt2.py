"""A Hugging Face ``transformers`` model on fxtrack's PyTorch path: GPT-2 built from a local
config (nothing downloaded), trained on next-token prediction. From examples/ (or with it on
PYTHONPATH):

    # eager vs torch.compile, fp32 vs bf16: one sweep, four cells
    python -m fxtrack -m framework=torch model=custom model.torch=hf_gpt2:build_torch \\
        framework.compile=false,true precision=fp32,bf16
    # GPT-2 small's sizes
    python -m fxtrack framework=torch model=custom model.torch=hf_gpt2:build_torch \\
        model.kwargs.layers=12 model.kwargs.hidden=768 model.kwargs.heads=12 \\
        model.kwargs.seq_len=1024 model.kwargs.vocab=50257

Needs ``pip install 'fxtrack[byom-examples]'``.
"""

from __future__ import annotations


def build_torch(batch_size: int, seed: int, layers: int = 2, hidden: int = 64, heads: int = 2,
                seq_len: int = 32, vocab: int = 512):
    import torch
    import torch.nn.functional as F
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=seq_len,
                        vocab_size=vocab, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        # no KV cache in the outputs: torch.export (scenario=checkpoint) takes
                        # tensors, and training has no use for one
                        use_cache=False)
    model = GPT2LMHeadModel(config)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=generator)

    def loss(out, targets):  # out: the model's CausalLMOutput
        return F.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten())

    return model, ({"input_ids": tokens[:, :-1]}, tokens[:, 1:]), loss
