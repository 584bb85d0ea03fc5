"""Quiet-machine A/B in one process, the arms alternating: fxtrack's torch ViT (or BERT,
MODEL=bert) as bench/reference.py builds it (compile=auto; its attention split along the
features since 2026-12-07), the three-projection form of that attention (fx:sep, as Hugging
Face's), the fused form with q, k and v made contiguous before SDPA (fx:contig), and Hugging
Face's model under torch.compile, at one precision (docs/measurements.md, "torch's ViT against
Hugging Face's"). Arms: fx, fx:sep, fx:contig, ref; the last named is the base.
Printed per arm: its median step and the base's step time / the arm's, paired per round, as
the geometric mean with the 95% t interval of the mean log ratio (fxtrack/stats.py).

    python bench/attention_ab.py bf16 fx,fx:sep,ref 8
    MODEL=bert python bench/attention_ab.py fp32 fx,ref 6
"""

from __future__ import annotations

import importlib.util
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from fxtrack import stats  # noqa: E402
from fxtrack.frameworks.torch.models import SelfAttention as FusedAttention  # noqa: E402


class SepAttention(nn.Module):
    """Three projections, as Hugging Face's ViTSelfAttention."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (m(x).view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for m in (self.q, self.k, self.v))
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, c))


class ContigAttention(FusedAttention):
    """fxtrack's fused product, each of q, k, v copied to a contiguous (B, heads, T, head_dim)
    tensor before SDPA (fx passes SDPA three strided views of the product)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2).contiguous()
                   for z in self.qkv(x).split(c, dim=-1))
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, c))


VARIANTS = {"sep": SepAttention, "contig": ContigAttention}


def main() -> None:
    precision, names = sys.argv[1], sys.argv[2].split(",")
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    model = os.environ.get("MODEL", "vit")
    spec = importlib.util.spec_from_file_location("reference", ROOT / "bench" / "reference.py")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    import fxtrack.frameworks.torch.models as models

    original, arms = models.SelfAttention, {}
    for name in names:
        kind = "reference" if name == "ref" else "fxtrack"
        arm = dict(kind=kind, model=model, framework="torch", dims=dict(ref.SIZES[model]),
                   batch=8, warmup=3, precision=precision, reference="hf",
                   mode="compile" if kind == "reference" else "auto")
        arch, job = ref.job(arm)
        models.SelfAttention = VARIANTS[name[3:]] if name.startswith("fx:") else original
        step, mode = (ref.fxtrack_step if kind == "fxtrack" else ref.torch_reference_step)(
            arm, arch, job)
        models.SelfAttention = original
        for _ in range(4):  # warm-up (and compile)
            step()
        arms[name] = step
        print(name, mode, flush=True)
    times: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            for _ in range(4):
                arms[name]()
            times[name].append((time.perf_counter() - start) / 4)
    base = names[-1]
    for name in names:
        ratio = stats.log_t_interval([b / t for b, t in zip(times[base], times[name])])
        mean = stats.log_summary([b / t for b, t in zip(times[base], times[name])])[0]
        print(f"{precision} {name:10s} step median {statistics.median(times[name]) * 1e3:7.1f} ms"
              f"  {base} / arm: {math.exp(mean):.3f} [{ratio.low:.3f}, "
              f"{ratio.high:.3f}] ({rounds} rounds)")


if __name__ == "__main__":
    main()
