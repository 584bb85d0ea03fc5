"""scenario=generate: greedy decoding with a KV cache (its runner)."""

from __future__ import annotations

import dataclasses

from fxtrack import families
from fxtrack.metrics import HIGHER, LOWER, Metric
from fxtrack.scenarios.options import Options, positive
from fxtrack.scenarios.registry import MEASURE, Objective, Rule, Scenario, one_device, register


@dataclasses.dataclass
class GenerateOptions(Options):
    """Greedy decoding with a KV cache (model=llama): prefill ``prompt_len`` tokens, then decode
    ``new_tokens`` one at a time; batch_size sequences at once."""

    name: str = "generate"
    prompt_len: int = 128  # prompt tokens per sequence (prefill)
    new_tokens: int = 128  # tokens decoded greedily after the prompt

    def __post_init__(self) -> None:
        super().__post_init__()
        positive("scenario.", prompt_len=self.prompt_len, new_tokens=self.new_tokens)


# the metrics only scenario=generate logs (docs/contract.md's Metrics tables; fxtrack.metrics)
METRICS = (
    Metric("ttft_ms_{p50|p90}", "ms", LOWER, "time to the first token"),
    Metric("decode_ms_per_token_{p50|p90}", "ms", LOWER, "one decode step through the cache"),
    Metric("decode_tokens_per_s", "tokens/s", HIGHER, "tokens decoded per second"),
    Metric("kv_cache_mib", "MiB", LOWER, "the KV cache's bytes"),
)


SPEC = register(Scenario(
    "generate", "greedy decoding with a KV cache: time to first token, decode tokens/s",
    GenerateOptions, __name__, own_metrics=METRICS,
    needs=("generate",), trains=False, decodes=True, rules=(
        # a family not known here (the worker checks again) may be one
        Rule(lambda c: f"scenario=generate with a {c.family or 'non-LM'} model",
             lambda c: bool(c.family) and not families.get(c.family).generates,
             "generation needs a decoder LM; use model=llama (or llama_8b)"),
        one_device("generate", "generation runs on one device; set devices=1")),
    objectives=(
        Objective("ttft", "Generation: time to first token", ("ttft_ms_p50",), "common",
                  ("starts generating", "faster than"), MEASURE % "generate", rank=50,
                  lm_only=True),
        Objective("decode", "Generation: decode tokens/s", ("decode_tokens_per_s",), "common",
                  ("decodes", "as fast as"), MEASURE % "generate", rank=60, lm_only=True))))
