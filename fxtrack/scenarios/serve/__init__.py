"""scenario=serve: requests arriving at a rate, batched (its runner, with the shared
``fxtrack.scenarios.batching``), and its report section."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from fxtrack.metrics import HIGHER, LOWER, NEITHER, Metric
from fxtrack.scenarios.options import Options, apart, at_least, finite_fields, positive
from fxtrack import families
from fxtrack.scenarios.registry import (
    MEASURE,
    Objective,
    Rule,
    Scenario,
    deploy_levers,
    is_deploy,
    one_device,
    register,
)


def number_or_search(key: str, value: str, what: str) -> float:
    """``scenario.<key>`` that is not ``search``: a positive number, else one line saying so."""
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"scenario.{key} must be {what} or 'search', got {value!r}") from None
    positive("scenario.", **{key: number})
    return number


SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")


@dataclasses.dataclass
class SloOptions:
    """scenario=serve's latency objectives in ms; None: not set."""

    ttft_ms: Optional[float] = None
    tpot_ms: Optional[float] = None
    e2e_ms: Optional[float] = None

    def __post_init__(self) -> None:
        finite_fields("scenario.slo.", self)
        positive("scenario.slo.", ttft_ms=self.ttft_ms, tpot_ms=self.tpot_ms, e2e_ms=self.e2e_ms)

    def as_dict(self) -> dict[str, Optional[float]]:
        return {k: getattr(self, k) for k in SLO_KEYS}


@dataclasses.dataclass
class ServeOptions(Options):
    """Requests arriving at ``rate`` (or a closed loop of ``concurrency`` clients), batched by
    one policy for every framework; per-request latency and goodput under ``slo``. The model is
    built at the largest batch bucket: batch_size is the serving policy's, not a free key."""

    name: str = "serve"
    prompt_len: int = 128  # language models: prompt tokens per request
    new_tokens: int = 128  # language models: tokens decoded per request (the mean)
    rate: str = "search"  # requests/s, or "search": the highest rate under the SLOs
    burstiness: float = 1.0  # gamma shape of the arrival gaps; 1 = Poisson
    # closed loop with this many clients (rate ignored), or "search": the most clients under
    # the SLOs (text, as rate is: the config types it once for both)
    concurrency: Optional[str] = None
    max_batch: int = 4  # the most requests one batch serves
    max_wait_ms: float = 10.0  # the batcher waits this long for a batch to fill
    batch_buckets: Optional[list[int]] = None  # padded batch sizes compiled; None: [max_batch]
    num_requests: int = 32  # requests per window (each probe of a search)
    # the reported p99 over enough requests for MLPerf's early-stopping rule (459): a fixed
    # rate's window takes that many; a search's small probes find the bracket, then a window
    # of that many confirms its highest passing rate (docs/serving.md#enough-requests-for-a-tail)
    sized_tail: bool = False
    duration_s: Optional[float] = None  # or: the requests arriving within this many seconds
    resolution: float = 0.25  # the rate search stops when the bracket is this fraction of the rate
    # static: a batch's requests start and end together; continuous: a request joins a free
    # KV-cache slot at the next decode step and leaves at its last token (language models)
    batching: str = "static"
    # fixed | uniform | lognormal | dataset: prompt and output lengths (seeded)
    length_dist: str = "fixed"
    length_data: Optional[str] = None  # length_dist=dataset: pycode, or a UTF-8 text file
    length_sigma: float = 0.5  # lognormal's sigma; uniform: half-width as a fraction of the mean
    timeout_ms: Optional[float] = None  # a request waiting longer than this is dropped (failed)
    token_spread: Optional[int] = None  # folded into length_dist=uniform: refused if given
    slo: SloOptions = dataclasses.field(default_factory=SloOptions)
    # a sweep's window at a rate every framework and policy served (orchestrator/sweep.py
    # common_rate_windows): one more probe of the search whose result id it names
    probe_of: str = apart("a window of another run's rate search, counted through it",
                          default="")

    def __post_init__(self) -> None:
        if isinstance(self.slo, dict):  # read back from a JobSpec's JSON
            self.slo = SloOptions(**self.slo)
        self.rate = str(self.rate)
        if self.concurrency is not None:
            self.concurrency = str(self.concurrency)
        super().__post_init__()
        positive("scenario.", prompt_len=self.prompt_len, new_tokens=self.new_tokens,
                 burstiness=self.burstiness, max_batch=self.max_batch,
                 resolution=self.resolution, duration_s=self.duration_s)
        if self.concurrency not in (None, "search"):
            clients = number_or_search("concurrency", self.concurrency, "a number of clients")
            if clients != int(clients):
                raise ValueError(f"scenario.concurrency is a number of clients, got {clients:g}")
            self.concurrency = str(int(clients))
        if self.token_spread is not None:
            raise ValueError("scenario.token_spread is folded into scenario.length_dist=uniform "
                             "(spread: scenario.length_sigma, a fraction of the mean)")
        at_least("scenario.", 0, max_wait_ms=self.max_wait_ms, length_sigma=self.length_sigma)
        positive("scenario.", timeout_ms=self.timeout_ms)
        if self.batching not in BATCHING:
            raise ValueError(f"scenario.batching must be one of {'|'.join(BATCHING)}, "
                             f"got {self.batching!r}")
        if self.length_dist not in LENGTH_DISTS:
            raise ValueError(f"scenario.length_dist must be one of {'|'.join(LENGTH_DISTS)}, "
                             f"got {self.length_dist!r}")
        if self.length_dist == "uniform" and self.length_sigma >= 1:
            raise ValueError("scenario.length_sigma is the uniform's half-width as a fraction "
                             f"of the mean: below 1, got {self.length_sigma}")
        if (self.length_dist == "dataset") != (self.length_data is not None):
            raise ValueError("scenario.length_dist=dataset draws lengths from scenario."
                             "length_data (pycode, or a text file), and only it reads one: "
                             "set both or neither")
        if self.batching == "continuous" and self.batch_buckets is not None:
            raise ValueError("scenario.batching=continuous steps every one of scenario.max_batch "
                             "slots at once; drop scenario.batch_buckets")
        if self.batching == "continuous" and self.concurrency is not None:
            raise ValueError("scenario.batching=continuous serves an open loop; drop "
                             "scenario.concurrency or use scenario.batching=static")
        at_least("scenario.", 2, num_requests=self.num_requests)
        if self.sized_tail and self.duration_s is not None:
            raise ValueError("scenario.sized_tail sizes a window by its requests; drop "
                             "scenario.duration_s (or scenario.sized_tail)")
        if self.rate != "search":
            number_or_search("rate", self.rate, "a number of requests/s")
        if self.probe_of and (self.rate == "search" or self.concurrency is not None):
            raise ValueError("scenario.probe_of names the rate search a window belongs to: "
                             "it takes a fixed scenario.rate")
        buckets = self.buckets
        if min(buckets) < 1:  # a bucket is a batch size: [0, 8] covers max_batch, still wrong
            raise ValueError(f"scenario.batch_buckets are batch sizes, each 1 or more; got "
                             f"{self.batch_buckets} (drop {min(buckets)})")
        if max(buckets) < self.max_batch:
            raise ValueError(f"scenario.batch_buckets {buckets} do not cover "
                             f"scenario.max_batch={self.max_batch}; add a bucket >= "
                             f"{self.max_batch}")

    def refusal(self, lm: bool) -> Optional[str]:
        """What the values alone cannot say: an SLO this model has no figure for, a search
        with nothing to search under; None when it may run."""
        if not lm and self.batching == "continuous":
            return ("scenario.batching=continuous schedules decode steps: a language model's "
                    "(model=llama); this model has scenario.batching=static")
        if not lm:
            lm_set = [k for k in ("ttft_ms", "tpot_ms") if getattr(self.slo, k) is not None]
            if lm_set:
                return (f"scenario.slo.{lm_set[0]} is a language-model figure; this model has "
                        "only scenario.slo.e2e_ms")
        if all(v is None for v in self.slo.as_dict().values()):
            if self.concurrency == "search":
                return ("scenario.concurrency=search needs an SLO to search under; set "
                        "scenario.slo.e2e_ms")
            if self.concurrency is None and self.rate == "search":
                return "scenario.rate=search needs an SLO to search under; set scenario.slo.e2e_ms"
        return None

    @property
    def buckets(self) -> list[int]:
        """The batch sizes compiled, smallest first (``batch_buckets``, else ``[max_batch]``)."""
        return sorted(set(self.batch_buckets or [self.max_batch]))


BATCHING = ("static", "continuous")
# fxtrack.scenarios.batching.draw_lengths; dataset: batching.dataset_lengths
LENGTH_DISTS = ("fixed", "uniform", "lognormal", "dataset")


def refusal(options: ServeOptions, family: Any, batch_size: Optional[int]) -> Optional[str]:
    """Bad serve input the values alone cannot show, one line, before any work."""
    from fxtrack.scenarios.batching import length_data_refusal  # numpy: when serve is asked

    why = options.refusal(family.generates) or length_data_refusal(options.length_dist,
                                                                   options.length_data)
    largest = options.buckets[-1]
    if why is None and batch_size is not None and batch_size != largest:
        # the model is built at the largest bucket: another batch_size would be dropped
        return (f"scenario=serve builds the model at its largest batch bucket ({largest}, from "
                f"scenario.max_batch / scenario.batch_buckets); batch_size={batch_size} would "
                f"be ignored: drop it, or set scenario.max_batch={batch_size}")
    return why


def capability(c: Any) -> Optional[tuple[str, str]]:
    """What serving the combination's model needs: a decoder LM is served token by token
    (generate), another fxtrack model as batched forwards (inference); a user's model is the
    user builder's to say (rules.refusal)."""
    family = families.get(c.family) if c.family else None
    if family is not None and family.generates:
        return "generate", "scenario=serve with model=llama"
    if family is None or family.user is None:
        return "inference", "scenario=serve"
    return None


# the metrics only scenario=serve logs (docs/contract.md's Metrics tables; fxtrack.metrics)
METRICS = (
    Metric("serve_e2e_ms_{p50|p90|p99}", "ms", LOWER, "arrival to last token"),
    Metric("serve_ttft_ms_{p50|p90|p99}", "ms", LOWER, "arrival to first token"),
    Metric("serve_tpot_ms_{p50|p90|p99}", "ms", LOWER, "time per output token after the first"),
    Metric("serve_itl_ms_{p50|p90|p99}", "ms", LOWER, "gap between consecutive tokens"),
    Metric("serve_requests", "count", NEITHER, "requests in the window"),
    Metric("serve_queue_ms_{p50|p90|p99}", "ms", LOWER, "arrival to admission: waiting"),
    Metric("serve_service_ms_{p50|p90|p99}", "ms", LOWER, "admission to last token: working"),
Metric("serve_percentile_requests", "count", NEITHER,
           "completed requests behind each percentile"),
    Metric("failed_requests", "count", LOWER, "requests timed out or whose step raised"),
    Metric("timed_out_requests", "count", LOWER, "requests dropped past scenario.timeout_ms"),
    Metric("load_s", "s", LOWER, "cold start: the model built on the device"),
    Metric("compile_s", "s", LOWER, "cold start: every bucket prepared and run once"),
    Metric("first_request_ms", "ms", LOWER, "cold start: the first request, before warm-up"),
    Metric("request_throughput_rps", "requests/s", HIGHER, "requests completed per second"),
    Metric("output_tokens_per_s", "tokens/s", HIGHER, "output tokens per second"),
    Metric("goodput_rps", "requests/s", HIGHER, "requests meeting every SLO per second"),
    Metric("slo_attained_fraction", "fraction", HIGHER, "share of requests meeting every SLO"),
    Metric("requested_rate_rps", "requests/s", NEITHER, "the arrival rate asked for"),
    Metric("achieved_rate_rps", "requests/s", NEITHER, "the arrival rate achieved"),
    Metric("completion_rate_rps", "requests/s", HIGHER, "how fast requests completed"),
    Metric("admission_rate_rps", "requests/s", HIGHER,
       "how fast the queue was drained: the saturation verdict's figure"),
    Metric("batches", "count", NEITHER, "batches served"),
    Metric("mean_batch_size", "count", NEITHER, "requests per batch"),
    Metric("serve_recompiles", "count", LOWER, "compilations inside the window"),
    Metric("max_rate_under_slo_rps", "requests/s", HIGHER, "the highest rate meeting every SLO"),
    Metric("highest_passing_rate_rps", "requests/s", HIGHER, "the same"),
    Metric("lowest_failing_rate_rps", "requests/s", HIGHER, "the lowest rate that failed"),
    Metric("max_concurrency_under_slo", "clients", HIGHER,
       "the most closed-loop clients meeting every SLO"),
    Metric("lowest_failing_concurrency", "clients", HIGHER, "the fewest clients that failed"),
    Metric("mismatched_requests", "count", LOWER,
       "requests served other tokens than their prompt decoded alone"),
Metric("first_mismatch_position", "token", NEITHER,
           "the earliest output position that differed"),
    Metric("serve_output_checked_requests", "count", NEITHER,
       "requests whose tokens were checked"),
    Metric("serve_output_check_s", "s", NEITHER, "the output check's time, outside the windows"),
)


SPEC = register(Scenario(
    "serve", "requests arriving at a rate, batched: latency percentiles, goodput under SLOs",
    ServeOptions, __name__, own_metrics=METRICS,
    parts=("runner", "section"), refusal=refusal, trains=False,
    mfu=False, decodes=True, from_run=True, named_options=("batching", "length_dist"),
    rules=(Rule(lambda c: f"scenario=serve with {deploy_levers(c)}", is_deploy,
                "scenario=serve feeds the framework's own compiled step; no exported runtime "
                "has a serving path yet: drop the runtime/quantize override (scenario=inference "
                "measures it)"),
           one_device("serve", "serving is measured on one device; set devices=1")),
    capability=capability,
    probe_tag="serve_probe_of", child_tags=("serve_mode", "serve_batching", "serve_buckets"),
    artifacts=("serve_requests",), objectives=(
        Objective("serve", "Serving capacity under the SLOs",
                  ("max_rate_under_slo_rps", "goodput_rps"), "common",
                  ("serves", "as many requests/s of"), MEASURE % "serve", rank=40,
                  modes=("scenario.batching",)),
        # capacity planned in users: the most closed-loop clients meeting every SLO
        Objective("users", "Serving capacity in concurrent users", ("max_concurrency_under_slo",),
                  "common", ("serves", "as many concurrent users of"),
                  MEASURE % "serve" + " scenario.concurrency=search scenario.slo.e2e_ms=<ms>",
                  rank=41, modes=("scenario.batching",)),)))
