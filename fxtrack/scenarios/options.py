"""Each scenario's typed options (``scenario.<key>``): one dataclass per scenario, each option and
its default written once, here. The config layer registers them in Hydra's ConfigStore as
``scenario/<name>`` (``fxtrack.config.schema.register``), so a typo or a wrong type fails while
Hydra composes; ``__post_init__`` checks the values (NaN and inf included) when the orchestrator
turns the composed config into objects, and again when the worker reads its JobSpec.

Plain dataclasses: no Hydra, no OmegaConf, no framework (the worker reads them too).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional


def finite(owner: str, **values: Any) -> None:
    """The one check every numeric option goes through (a number given as text too): NaN and
    inf pass every ``value <= 0`` refusal (a NaN timeout_s turned the watchdog off, issue 43)."""
    for key, value in values.items():
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                continue  # a word ("search"): the option's own check says what it takes
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{owner}{key} must be a finite number, got {value}")


def finite_fields(owner: str, obj: Any) -> None:
    """``finite`` over every field of a dataclass instance: a new float key is covered too."""
    finite(owner, **{f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})


def positive(owner: str, **values: Any) -> None:
    """Raise ValueError unless each value that is set is a finite number above 0."""
    finite(owner, **values)
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{owner}{key} must be a number, got {value!r}")
        if value <= 0:
            raise ValueError(f"{owner}{key} must be a positive number, got {value}")


def _number_or_search(key: str, value: str, what: str) -> float:
    """``scenario.<key>`` that is not ``search``: a positive number, else one line saying so."""
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"scenario.{key} must be {what} or 'search', got {value!r}") from None
    positive("scenario.", **{key: number})
    return number


def at_least(owner: str, floor: float, **values: Any) -> None:
    """Raise ValueError unless each value that is set is finite and >= ``floor``."""
    finite(owner, **values)
    for key, value in values.items():
        if value is not None and value < floor:
            raise ValueError(f"{owner}{key} must be >= {floor:g}, got {value}")


# A config field's metadata key: every key a run logs is part of its identity (which runs are
# one experiment, fxtrack.report.identity) unless its field says why not, with ``apart``.
IDENTITY = "identity"


def apart(why: str, **field: Any) -> Any:
    """A dataclass field kept out of a run's identity, with the reason beside the key."""
    return dataclasses.field(metadata={IDENTITY: why}, **field)


def apart_keys(cls: type, prefix: str = "") -> dict[str, str]:
    """``prefix + key`` -> why, for the fields of ``cls`` declared ``apart``."""
    return {prefix + f.name: f.metadata[IDENTITY] for f in dataclasses.fields(cls)
            if f.metadata.get(IDENTITY)}


def apart_from_identity() -> dict[str, str]:
    """``scenario.<key>`` -> why, of every option of every scenario declared apart."""
    found, todo = {}, [Options]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        found.update(apart_keys(cls, "scenario."))
    return found


@dataclasses.dataclass
class Options:
    """What every scenario's options have: the scenario's name (``scenario=<name>``)."""

    name: str = ""

    def __post_init__(self) -> None:  # every subclass's numeric option, present and future
        finite_fields("scenario.", self)


@dataclasses.dataclass
class TrainOptions(Options):
    name: str = "train"
    # after the timed window: this many steps under the framework's own profiler, their time
    # split into categories (the profile_* metrics); 0: none.
    profile_steps: int = apart("profiled after the timed window: the figures are measured "
                               "before it", default=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least("scenario.", 0, profile_steps=self.profile_steps)


@dataclasses.dataclass
class InferenceOptions(Options):
    """The timed window runs ``steps`` batches, and on until it has timed at least
    ``min_queries`` batches and lasted ``min_duration_s`` (MLPerf's min_query_count and
    min_duration): a p99 needs 459 batches behind it (batching.min_queries_for)."""

    name: str = "inference"
    # None: steps alone
    min_queries: Optional[int] = apart("the window's length, as steps: a longer window sizes "
                                       "the tail, it measures the same thing", default=None)
    # None: no floor on the window's time
    min_duration_s: Optional[float] = apart("the window's length, as steps", default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        positive("scenario.", min_queries=self.min_queries, min_duration_s=self.min_duration_s)


@dataclasses.dataclass
class CheckpointOptions(Options):
    name: str = "checkpoint"


@dataclasses.dataclass
class ScalingOptions(Options):
    """Throughput at 1, 2, 4, ... up to ``devices``: each device count a training run."""

    name: str = "scaling"


@dataclasses.dataclass
class PipelineOptions(Options):
    name: str = "pipeline"
    dataset_samples: int = 512  # samples in the on-disk synthetic dataset ($FXTRACK_CACHE)
    loader_workers: int = 2  # loader processes / parallel calls

    def __post_init__(self) -> None:
        super().__post_init__()
        positive("scenario.", dataset_samples=self.dataset_samples)
        at_least("scenario.", 0, loader_workers=self.loader_workers)


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


@dataclasses.dataclass
class FitOptions(Options):
    """The largest batch_size (or, with axis=seq_len, the longest sequence of a language model)
    that trains within the memory budget: one parent run, one isolated worker per probe."""

    name: str = "fit"
    axis: str = "batch_size"  # or seq_len (language models)
    max_probes: int = 8
    max_batch: int = 4096  # the largest value probed on either axis
    # below 1: stop when the largest fit and the smallest miss are within this fraction of the
    # fit; 1 or more: a step
    resolution: float = 0.05
    memory_gib: Optional[float] = None  # None: the pre-check's memory; on a GPU its total

    def __post_init__(self) -> None:
        super().__post_init__()
        positive("scenario.", max_probes=self.max_probes, max_batch=self.max_batch,
                 resolution=self.resolution, memory_gib=self.memory_gib)
        if self.axis not in ("batch_size", "seq_len"):
            raise ValueError(f"scenario.axis must be batch_size or seq_len, got {self.axis!r}")


# scenario=converge's held-out metrics and the range a target of each may take
CONVERGE_METRICS = {"accuracy": (0.0, 1.0), "loss": (0.0, math.inf), "bits_per_byte": (0.0, 8.0)}


@dataclasses.dataclass
class ConvergeOptions(Options):
    """Train on real data (``data=``) until the held-out ``metric`` meets ``target``, evaluating
    every ``eval_every`` steps, within ``max_epochs``; each None: the family's default for the
    dataset (fxtrack.families.quality)."""

    name: str = "converge"
    metric: Optional[str] = None  # accuracy (higher is better) | loss | bits_per_byte (lower)
    target: Optional[float] = None
    eval_every: Optional[int] = None  # optimiser steps between evaluations
    max_epochs: Optional[int] = None  # the budget: a run that misses the target by then ends
    max_steps: Optional[int] = None  # and at most this many optimiser steps (None: no cap)
    lr: Optional[float] = None  # AdamW's peak learning rate
    warmup_frac: float = 0.05  # share of the budget's steps warming up linearly, then cosine
    eval_samples: int = 1024  # held-out samples evaluated (the first ones: the same each time)
    trajectory_steps: int = 10  # the first K training losses compared with the first framework's
    trajectory_tol: float = 1e-3  # relative difference per step beyond which they diverged
    quality_tol: float = 0.01  # a lever's final metric this much worse than fp32's: lost

    def __post_init__(self) -> None:
        super().__post_init__()
        positive("scenario.", eval_every=self.eval_every, max_epochs=self.max_epochs,
                 max_steps=self.max_steps,
                 lr=self.lr, eval_samples=self.eval_samples,
                 trajectory_steps=self.trajectory_steps, trajectory_tol=self.trajectory_tol)
        at_least("scenario.", 0, quality_tol=self.quality_tol)
        at_least("scenario.", 0, warmup_frac=self.warmup_frac)
        if self.warmup_frac >= 1:
            raise ValueError(f"scenario.warmup_frac must be below 1, got {self.warmup_frac}")
        if self.metric is not None and self.metric not in CONVERGE_METRICS:
            raise ValueError(f"scenario.metric must be one of {', '.join(CONVERGE_METRICS)}, "
                             f"got {self.metric!r}")
        if self.target is not None:
            self.target_refusal(self.metric or "loss")  # every metric's targets are above 0

    def target_refusal(self, metric: str) -> None:
        """Raise ValueError when ``target`` lies outside ``metric``'s range."""
        low, high = CONVERGE_METRICS[metric]
        if self.target is not None and not low < float(self.target) <= high:
            raise ValueError(f"scenario.target={self.target} is outside {metric}'s range "
                             f"({low:g}, {high:g}]")


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
            clients = _number_or_search("concurrency", self.concurrency, "a number of clients")
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
            _number_or_search("rate", self.rate, "a number of requests/s")
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


def defaults(cls: type, prefix: str = "scenario.") -> dict[str, Any]:
    """Each option of ``cls`` as its dotted key (``scenario.slo.e2e_ms``: a nested dataclass's
    keys included) with its default; the scenario's name left out."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name == "name":
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out.update(defaults(type(default), f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = default
    return out


def from_json(cls: type, values: Any) -> Options:
    """``cls`` from a JobSpec's options (a dict read back from JSON, or already ``cls``); keys
    ``cls`` does not have are an error, so that a misspelt option never silently defaults."""
    if isinstance(values, cls):
        return values
    if isinstance(values, Options):  # another scenario's (a spec reused for a new scenario):
        # its options at their defaults are not asked for; one set is still refused below
        unset = defaults(type(values), "")
        values = {k: v for k, v in dataclasses.asdict(values).items()
                  if k != "name" and (k not in unset or v != unset[k])}
    values = dict(values or {})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"scenario={values.get('name', cls.name)} has no option "
                         f"{unknown[0]!r} (options: {', '.join(sorted(names - {'name'}))})")
    values.setdefault("name", cls.name)
    return cls(**values)
