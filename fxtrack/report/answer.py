"""The answer first: per model and machine, which framework wins each objective and by how much.

One block per objective (``objectives()``: each scenario declares its own, with the metric it
reads, in its folder, ``fxtrack/scenarios/<name>/``). Every config (framework with its
mode and levers) of a model on one machine is a candidate; each framework stands on its best
config; the best framework is the reference and every other framework's ratio to it carries the
Welch 95% interval of fxtrack/stats.py (through samples.ratio and verdicts.Ratio, the report's
verdict logic): "no clear difference" where the interval holds 1, "single runs: no verdict"
without repeats. An objective with no runs says the command that measures it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import pandas as pd

from fxtrack import architectures, scenarios
from fxtrack.config.frameworks import declared, identity_settings
from fxtrack.report import identity, samples
from fxtrack.report.lm import lm_models
from fxtrack.report.verdicts import Ratio
from fxtrack.scenarios import Objective

NO_CLEAR, SINGLE = "no clear difference", "single runs: no verdict"
RULED = "no verdict: the rule keeps no figure"  # e.g. MLPerf's, a missed run among the kept
# Friendly names for sentences; an unknown framework keeps its own name.
# how a sentence names each framework, and a variant by its backend (keras[jax]: Keras-on-JAX),
# from the declarations
FRAMEWORK_WORDS = {name: f.said for name, f in declared().items()}
BACKEND_WORDS = {name: f"{FRAMEWORK_WORDS.get('keras', 'Keras')}-on-{words}"
                 for name, words in FRAMEWORK_WORDS.items() if name != "keras"}


def objectives() -> tuple[Objective, ...]:
    """The answer page's objectives, declared by the scenarios (``Scenario.objectives``), each
    command naming the declared frameworks that can run its scenario."""
    found = []
    for objective in scenarios.objectives():
        needs = scenarios.get(objective.scenario).needs
        able = [name for name, f in declared().items() if all(n in f.capabilities for n in needs)]
        found.append(dataclasses.replace(objective, command=objective.command.replace(
            "{frameworks}", ",".join(able))))
    return tuple(found)


@dataclasses.dataclass
class Entry:
    """One framework's best config for an objective."""

    framework: str
    mode: str  # "compile=auto, runtime=onnxruntime": what differs from the plain defaults
    sample: samples.Sample
    metric: str


@dataclasses.dataclass
class Block:
    objective: Objective
    model: str
    machine: str  # "cpu, fp32, x1" (hardware, precision, devices)
    cpu: str  # the processor/device words from the runs' tags
    entries: list[Entry]  # best first
    ratios: list[Ratio]  # the same order: each entry's figure / the best's
    batch: Optional[str] = None
    contended: bool = False  # a run behind a figure shared the cores with other processes
    label: str = ""  # the model as the dims that ran name it (identity.size_label)
    # what this comparison holds that differs between the model's blocks of one objective
    # (the data, the target, a serve load): "data=file (3f2a9c1e), scenario.target=0.9"
    where: str = ""
    held: dict = dataclasses.field(default_factory=dict)  # the experiment's columns, as held

    @property
    def caveats(self) -> list[str]:
        """Every caveat on a figure of the block, once, in the order of the entries."""
        return list(dict.fromkeys(c for e in self.entries for c in e.sample.caveats))

    @property
    def best(self) -> Entry:
        return self.entries[0]

    def verdict(self, ratio: Ratio) -> str:
        entry = next((e for e in self.entries if e.framework == ratio.framework), None)
        if entry is not None and entry.sample.why:  # repeats the metric's rule keeps none of
            return RULED
        if ratio.interval is None:
            return SINGLE
        return "clear" if ratio.clear else NO_CLEAR

    def summary(self) -> str:
        others = self.ratios[1:]
        if not others:
            return "one framework: nothing to compare"
        if any(r.interval is None for r in others):
            return SINGLE
        if all(not r.clear for r in others):
            return NO_CLEAR
        return f"{fw_words(self.best.framework)} best"


@dataclasses.dataclass
class Missing:
    objective: Objective
    model: str
    # what can run here: the frameworks the store's runs used (installed where they ran; None:
    # every one the objective names), and a size the memory check lets this hardware run
    frameworks: Optional[tuple[str, ...]] = None
    size: str = "full"
    dims: tuple[tuple[str, str], ...] = ()  # the model.* the runs of that label set
    label: str = ""  # the model as its dims name it: listed only where it has no figure

    def command(self) -> str:
        line = self.objective.command.format(model=self.model)
        if self.frameworks is not None:
            listed = line.split("framework=", 1)[1].split(" ", 1)[0]
            usable = [fw for fw in listed.split(",") if fw in self.frameworks] or list(self.frameworks)
            line = line.replace(f"framework={listed}", f"framework={','.join(usable)}")
            if len(usable) == 1:
                line = line.replace("python -m fxtrack -m ", "python -m fxtrack ")
        line += f" size={self.size}" if self.size != "full" else ""
        line += "".join(f" model.{k}={v}" for k, v in self.dims)
        return _on_declared_data(line, self.model)

    def checked(self) -> str:
        """The command as the page shows it: validated as a run is (fxtrack.config.suggest),
        commented with the reason where it would fail here."""
        from fxtrack.config.suggest import checked

        return checked(self.command())


def _on_declared_data(line: str, model: str) -> str:
    """A command's ``data=`` as the model's family can train on it: a data set the family
    declares reference runs for (a decoder LM: a byte corpus, not images), with those runs' dims
    where the line sets none (the ViT's 7-pixel patch on MNIST's 28-pixel digits)."""
    from fxtrack import families

    words = line.split(" ")
    data = next((w.split("=", 1)[1] for w in words if w.startswith("data=")), None)
    if data is None:
        return line
    try:
        declared = families.get(architectures.family(model)).quality
    except (KeyError, ValueError):  # a user's model: its own data
        return line
    if not declared:
        return line
    if data not in declared:
        data = next(iter(declared))
        words = [f"data={data}" if w.startswith("data=") else w for w in words]
    words += [f"model.{k}={v}" for k, v in declared[data].dims.items()
              if not any(w.startswith(f"model.{k}=") for w in words)]
    return " ".join(words)


def _suggested(configs: pd.DataFrame, model: str, objective: Objective,
               runs: pd.DataFrame) -> Missing:
    """The objective's command as this machine can run it for the model at the dims ``runs``
    (one label's) ran: its frameworks (those the runs used that are installed here), their
    size and dims, and ``size=tiny`` where the memory check refuses the full size here."""
    from fxtrack.config.frameworks import installed

    here = installed()  # the store's runs may come from another machine: what this one has
    fws = tuple(dict.fromkeys(f for f in configs["framework"] if f != "-" and f in here))
    size = str(runs["size"].iloc[-1]) if len(runs) else "full"
    size = "full" if size in ("-", "") else size
    if size == "full" and _refused(model, objective, runs):
        size = "tiny"
    dims = tuple((c[len("model."):], str(runs[c].iloc[-1])) for c in sorted(runs.columns)
                 if c.startswith("model.") and c != "model.from_run"
                 and str(runs[c].iloc[-1]) not in ("-", "", "nan", "None"))
    label = str(runs["label"].iloc[-1]) if len(runs) else model
    return Missing(objective, model, fws or here or None, size, dims, label)


def _refused(model: str, objective: Objective, runs: pd.DataFrame) -> bool:
    """Whether the memory check refuses ``model`` at full size for the objective's scenario on
    the hardware its runs used (one line, before any work: fxtrack.config.memory)."""
    from fxtrack.config import memory

    try:
        arch = architectures.resolve(model, "full")
    except (KeyError, ValueError):  # a user's model: its builder decides its size
        return False
    kind = "gpu" if (runs["hardware"] == "gpu").any() else "cpu"
    return memory.refusal(arch, objective.scenario, "fp32", None, kind) is not None


def fw_words(framework: str) -> str:
    base, _, backend = framework.partition("[")
    if backend:
        return BACKEND_WORDS.get(backend.rstrip("]"), framework)
    return FRAMEWORK_WORDS.get(base, base)


def _framework(config: pd.Series) -> str:
    # a framework's identity setting (Keras's backend) names a variant of it: keras[jax]
    variant = [str(config[k]) for k in identity_settings() if config.get(k, "-") not in ("-", None, "")]
    return config["framework"] + (f"[{variant[0]}]" if variant else "")


def _mode(config: pd.Series) -> str:
    parts = [f"compile={config['compile']}"] if config.get("compile", "-") not in ("-", "") else []
    parts += [f"{k}={config[k]}" for k, default in identity.LEVERS.items() if config.get(k, default) != default]
    return ", ".join(parts) or "defaults"


def _metric_of(runs: pd.DataFrame, objective: Objective) -> Optional[str]:
    return next((m for m in objective.metrics if f"metrics.{m}" in runs.columns
                 and runs[f"metrics.{m}"].notna().any()), None)


def _batch(runs: pd.DataFrame, rule: str) -> Optional[str]:
    """Which batch size the frameworks are compared at (a batch's figures never meet another's)."""
    sizes = runs.groupby("batch_size")["framework"].nunique()
    if sizes.empty:
        return None
    numeric = {b: (int(b) if str(b).isdigit() else -1) for b in sizes.index}
    if rule == "one":
        return "1" if "1" in sizes.index else None
    if rule == "largest":
        return max(sizes.index, key=lambda b: (sizes[b], numeric[b]))
    return max(sizes.index, key=lambda b: (sizes[b], -numeric[b]))


def blocks(frame: pd.DataFrame) -> tuple[list[Block], list[Missing]]:
    """The answer blocks of a ``search_runs`` frame, and the objectives of each model (at the
    dims that ran) with no figure at all. A block is one experiment: every identity column held
    equal but what a framework chooses (``identity.experiment``: its mode, levers and the
    objective's ``modes``), so runs to another target, on other data or at another load are
    another block, titled by what differs, never a row beside it."""
    configs = samples.configs(frame)
    if configs.empty:
        return [], []
    found: list[Block] = []
    missing: list[Missing] = []
    ident = [c for c in samples.identity_columns(configs) if c in configs.columns]
    cpu = _cpu_words(frame)
    tags = _run_tags(frame)
    # one set of blocks per model at each of its sizes: a tiny run never speaks for the full model
    for (model, label), of_model in configs.groupby(["model", "label"], sort=True):
        for objective in objectives():
            if objective.lm_only and model not in lm_models():
                continue
            runs = of_model[of_model["scenario"] == objective.scenario]
            key = _metric_of(runs, objective)
            if key is None:
                _add(missing, _suggested(configs, model, objective, of_model))
                continue
            if not objective.repeats_rule:  # a rule counts a run without the figure (a miss)
                runs = runs[runs[f"metrics.{key}"].notna()]
            held = [c for c in identity.experiment(ident, objective.modes)
                    if c not in ("batch_size", "model", "size") and not c.startswith("model.")]
            every = [dict(zip(held, k if isinstance(k, tuple) else (k,)))
                     for k, _ in runs.groupby(held, sort=True, dropna=False)]
            for k, on in runs.groupby(held, sort=True, dropna=False):
                where = dict(zip(held, k if isinstance(k, tuple) else (k,)))
                machine = (where["hardware"], where["precision"], where["devices"])
                batch = _batch(on, objective.batch)
                if batch is None:
                    _add(missing, _suggested(configs, model, objective, of_model))
                    continue
                block = _block(objective, model, machine, on[on["batch_size"] == batch], configs,
                               key, ident, cpu, tags)
                if block:
                    block.batch, block.label = batch, label
                    block.where = _where(where, every)
                    block.held = where
                    found.append(block)
    have = {(b.objective.key, b.label) for b in found}
    return found, [m for m in missing if (m.objective.key, m.label) not in have]


def _where(where: dict[str, str], every: list[dict[str, str]]) -> str:
    """What sets one block apart from the model's other blocks of its objective (its data,
    target, load): the held columns whose values differ between them; a user's file by its
    content digest."""
    out = []
    for k, v in where.items():
        if len({w.get(k) for w in every}) < 2 or k in ("hardware", "precision", "devices"):
            continue
        if k == "data.name" and where.get("data_digest", "-") != "-":
            continue  # said with its digest
        if k == "data_digest":  # a user's file by its content; a named data set by its name
            name = where.get("data.name", "?")
            out.append(f"data={name} ({v[:8]})" if name == "file" else f"data={name}")
        else:
            out.append(f"{k}={v}")
    return ", ".join(out)


def _add(missing: list[Missing], one: Missing) -> None:
    if one not in missing:  # a model at two sizes misses an objective once
        missing.append(one)


def _run_tags(frame: pd.DataFrame) -> dict[str, dict[str, str]]:
    """run id (and an aggregate's result id, through its repeats) -> the tags a block reads:
    what the compile mode resolved to, a serve run's batching policy (caveats, as whether the
    cores were contended, come with each figure: samples.sample)."""
    out: dict[str, dict[str, str]] = {}
    cols = {"mode": "tags.fxtrack.compile_mode", "of": "tags.fxtrack.repeat_of",
            "batching": "tags.fxtrack.serve_batching"}
    for _, row in frame.iterrows():
        got = {k: str(row[c]) for k, c in cols.items() if c in frame and isinstance(row[c], str)}
        out[row["run_id"]] = got
        if got.get("of"):  # a repeat speaks for its aggregate's mode
            agg = out.setdefault("result:" + got["of"], {})
            agg.setdefault("mode", got.get("mode", ""))
            agg.setdefault("batching", got.get("batching", ""))
    return out


def _entry_tags(group: pd.DataFrame, tags: dict[str, dict[str, str]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for _, row in group.iterrows():
        for source in (tags.get(row["run_id"], {}), tags.get(f"result:{row.get('result_id')}", {})):
            for key in ("mode", "batching"):
                if source.get(key) and not found.get(key):
                    found[key] = source[key]
    return found


def _block(objective: Objective, model: str, machine: tuple, runs: pd.DataFrame,
           every: pd.DataFrame, key: str, ident: list[str], cpu: str,
           tags: Optional[dict[str, dict[str, str]]] = None) -> Optional[Block]:
    best_per_fw: dict[str, Entry] = {}
    better = (lambda a, b: a < b) if objective.lower else (lambda a, b: a > b)
    # a framework's configs that differ in what it may choose beside its mode and levers (the
    # objective's modes: serve's batching policy) say so in the mode column
    apart = identity.apart(runs.drop(columns=["compile", *identity.LEVERS], errors="ignore"), ["model"])
    rule = (scenarios.get(objective.scenario).part("section", objective.repeats_rule)
            if objective.repeats_rule else None)
    for _, group in runs.groupby(ident, sort=False, dropna=False):
        one = samples.sample(group, every, key, rule)
        if one is None or not one.point or one.point != one.point:  # none, 0 or NaN
            continue
        config = group.iloc[-1]
        fw = _framework(config)
        extra = _entry_tags(group, tags or {})
        mode = _mode(config) + (f" ({extra['mode']})" if extra.get("mode") else "")
        if apart[group.index[-1]]:
            mode += f", {apart[group.index[-1]]}"
        if extra.get("batching") and "scenario.batching" not in apart[group.index[-1]]:
            mode += f", {extra['batching']} batching"  # serving: the policy is the answer's too
        if fw not in best_per_fw or better(one.point, best_per_fw[fw].sample.point):
            best_per_fw[fw] = Entry(fw, mode, one, key)
    if not best_per_fw:
        return None
    entries = sorted(best_per_fw.values(), key=lambda e: e.sample.point, reverse=not objective.lower)
    base = entries[0].sample
    ratios = []
    for e in entries:
        point, interval = samples.ratio(e.sample, base)
        if e is entries[0]:
            interval = (1.0, 1.0) if base.log else None
        ratios.append(Ratio(e.framework, point, interval, e.sample.n, ""))
    hardware, precision, devices = machine
    # only what the figures stand on: an earlier group's contended run qualifies nothing shown
    contended = any("contended" in e.sample.caveats for e in entries)
    return Block(objective, model, f"{hardware}, {precision}, x{devices}", cpu, entries, ratios,
                 contended=contended)


def _cpu_words(frame: pd.DataFrame) -> str:
    """``AMD EPYC (2 threads)``: the processor tag, with the threads the frameworks were given."""
    for col in ("tags.fxtrack.device_name", "tags.fxtrack.cpu"):
        if col in frame.columns and frame[col].notna().any():
            words = str(frame[col].dropna().iloc[-1])
            threads = frame.get("tags.fxtrack.cpu_threads")
            if col.endswith(".cpu") and threads is not None and threads.notna().any():
                words += f" ({threads.dropna().iloc[-1]} threads)"
            return words
    return "this machine"


def sentence(block: Block) -> str:
    """The block's verdict as one sentence a person can paste, from its figures only."""
    ob, best = block.objective, block.best
    verb, adjective = ob.phrase
    precision = block.machine.split(", ")[1]
    hardware = block.machine.split(", ")[0]
    head = (f"On this {block.cpu[:-1]}, {hardware})" if block.cpu.endswith(")")
            else f"On this {block.cpu} ({hardware})")
    model = block.label or architectures.display_name(block.model)
    if len(block.entries) == 1:
        where = f" ({block.where})" if block.where else ""
        return (f"{head}, only {fw_words(best.framework)} has a figure for {ob.title.lower()} of "
                f"{model}{where}." + _qualified(block))
    clear, tied, single, ruled = [], [], [], []
    for entry, r in zip(block.entries[1:], block.ratios[1:]):
        verdict = block.verdict(r)
        {"clear": clear, NO_CLEAR: tied, RULED: ruled}.get(verdict, single).append((entry, r))
    parts = []
    for entry, r in clear:
        # the best's figure relative to the other's, always >= 1: "1.13x as fast as"
        inverse = ob.lower == ob.fraction  # the ratio is the other's over the best's
        times = 1 / r.ratio if inverse else r.ratio
        low, high = sorted((1 / r.interval[0], 1 / r.interval[1]) if inverse else r.interval)
        parts.append(f"{'in ' if ob.fraction else ''}{times:.2f}x [{low:.2f}, {high:.2f}] "
                     f"{adjective} {fw_words(entry.framework)}")
    words = f"{head}, {fw_words(best.framework)} ({best.mode}) {verb} {model}"
    if parts:
        words += " " + "; ".join(parts) + f" at {precision}"
    else:
        words += f" best at {precision}"
    if tied:
        names = " and ".join(fw_words(e.framework) for e, _ in tied)
        words += f"; {names} show{'s' if len(tied) == 1 else ''} no clear difference from {fw_words(best.framework)}"
    if single:
        # the ratio the block's table shows (the other's figure over the best's)
        names = " and ".join(f"{fw_words(e.framework)} ({r.ratio:.2f}x the best's figure)"
                             for e, r in single)
        words += f"; {names}: single runs, no verdict"
    if ruled:
        names = " and ".join(f"{fw_words(e.framework)} ({r.ratio:.2f}x the best's figure)"
                             for e, r in ruled)
        words += f"; {names}: no verdict, the figure's rule keeps none of the runs"
    words += f" ({ob.title.lower()}{', ' + block.where if block.where else ''}, batch {block.batch})."
    return words + _qualified(block)


def _qualified(block: Block) -> str:
    """What the sentence carries after its verdict: every caveat on the block's figures and
    where a later, thinner group of a config replaced a fuller one."""
    words = ""
    marks = [c for c in block.caveats if c != "contended"]
    if block.contended:
        words += " Contended: other processes shared the cores; re-measure on a quiet machine."
    if marks:
        words += " Caveats: " + "; ".join(marks) + "."
    earlier = [f"{fw_words(e.framework)} ({e.sample.n} runs; an earlier group had "
               f"{e.sample.earlier})" for e in block.entries if e.sample.earlier]
    if earlier:
        words += (" The latest group of a config stands, not a larger earlier one: "
                  + ", ".join(earlier) + ".")
    return words
