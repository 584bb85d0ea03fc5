"""Profile one eager training step of fxtrack's torch Llama against Hugging Face's LlamaForCausalLM
(issue 35's config, fp32, fused AdamW, same loss): ops per step and the top ops by self CPU time.

    PYTHONPATH=. python bench/profile_llama.py fx|hf
"""
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from fxtrack.architectures import resolve
from fxtrack.frameworks.torch.models import build

B, T, V = 4, 128, 4096
CONFIG = dict(layers=4, hidden=256, heads=8, kv_heads=4, mlp_dim=512, vocab_size=V, seq_len=T)


def model(arm: str) -> torch.nn.Module:
    if arm == "fx":
        return build(resolve("llama", "tiny", **CONFIG))
    from transformers import LlamaConfig, LlamaForCausalLM  # a local config: no hub
    return LlamaForCausalLM(LlamaConfig(
        num_hidden_layers=4, hidden_size=256, num_attention_heads=8, num_key_value_heads=4,
        intermediate_size=512, vocab_size=V, max_position_embeddings=T, attn_implementation="sdpa"))


def main(arm: str) -> None:
    torch.manual_seed(0)
    m = model(arm)
    opt = torch.optim.AdamW(m.parameters(), fused=True)
    ids, labels = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out = m(ids) if arm == "fx" else m(input_ids=ids).logits
        F.cross_entropy(out.float().flatten(0, 1), labels.flatten()).backward()
        opt.step()

    for _ in range(2):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            step()
    events = prof.key_averages()
    print(arm, "ops/step", sum(e.count for e in events) // 2,
          "params", sum(p.numel() for p in m.parameters()))
    print(events.table(sort_by="self_cpu_time_total", row_limit=14))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fx")
