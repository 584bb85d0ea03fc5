"""What a sample (or a token) costs: ``hardware.price_per_hour`` spread over the run's rate.

The price is per device-hour of the hardware in use, in any currency (fxtrack never converts);
a run on ``devices`` devices on each of ``nodes`` nodes pays for all of them while it runs.
Pure arithmetic: the orchestrator adds the figures to a finished run's metrics, the report and
``fxtrack compare`` show them where they are present.
"""

from __future__ import annotations

from typing import Optional

PER = 1e6  # cost per million samples / tokens: a per-sample figure is too small to read

# metric the cost is computed from -> the cost metric's key
RATES = {"throughput_samples_per_s": "cost_per_1m_samples", "tokens_per_s": "cost_per_1m_tokens"}


def cost_per_million(price_per_hour: float, devices: int, nodes: int, rate_per_s: float) -> float:
    """price / 3600 x devices x nodes x 1e6 / rate: the price of one second of every device in
    use, times the seconds a million samples (or tokens) take at ``rate_per_s``."""
    if rate_per_s <= 0:
        raise ValueError(f"a cost needs a positive rate, got {rate_per_s}")
    return price_per_hour / 3600.0 * devices * nodes * PER / rate_per_s


def cost_metrics(price_per_hour: Optional[float], devices: int, nodes: int,
                 metrics: dict[str, float]) -> dict[str, float]:
    """``cost_per_1m_samples`` (and ``cost_per_1m_tokens`` where ``tokens_per_s`` was logged)
    for a run's ``metrics``; empty without a price or without a positive rate (absent, never 0)."""
    if price_per_hour is None:
        return {}
    return {key: cost_per_million(price_per_hour, devices, nodes, metrics[rate])
            for rate, key in RATES.items() if metrics.get(rate, 0) > 0}
