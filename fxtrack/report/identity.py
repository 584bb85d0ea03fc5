"""The one comparison identity: when two runs are the same experiment, and which runs pool.

Every reader asks this module: the page's answer and tables (select.py, samples.py), the charts,
``fxtrack compare``, ``fxtrack claims``, the converge section and the trend. A run's identity is
every key it logged, unless its config field is declared apart with its reason
(``fxtrack.config.schema.apart_from_identity``: a timeout, verbosity, the seed, a path whose
content digest is the identity instead). The declared columns below come first (framework and
its identity settings, compile mode, model, scenario, precision, devices, hardware, batch, size,
levers, the data's content digest), then every other param a run logged, sorted: the model's
dims, the scenario's options, the data, a config group added later, without anyone listing it.
Runs of one identity are one experiment; the latest stands. Figures pool only within a repeat
group: the repeats one ``repeats=N`` asked for (``fxtrack.repeat_of``), never runs that happen
to share parameters.
"""

from __future__ import annotations

from typing import Optional

import pandas as pd

from fxtrack import architectures
from fxtrack.config.frameworks import identity_settings
from fxtrack.config.schema import apart_from_identity

# Each lever and its default: runs at the defaults are the main tables' benchmarks.
LEVERS = {"runtime": "native", "quantize": "none", "parallel": "ddp", "memory": "none"}


def declared() -> dict[str, tuple[Optional[str], str]]:
    """Identity column -> (tag, param) it is read from; the tag (what actually ran) wins. Read
    at each call: a framework's identity settings come from its declaration."""
    return {
        "framework": ("fxtrack.framework", "framework.name"),
        # each framework's identity settings (Keras's backend), fxtrack.config.frameworks
        **{key: (f"fxtrack.{key}", f"framework.{key}") for key in identity_settings()},
        # what was asked for (auto / true / false / tune), a lever of the framework's own
        "compile": (None, "framework.compile"),
        "model": ("fxtrack.model", "model.name"),
        "scenario": ("fxtrack.scenario", "scenario.name"),
        "precision": ("fxtrack.precision", "precision.name"),
        "devices": ("fxtrack.devices", "devices"),
        "hardware": ("fxtrack.hardware", "hardware.name"),
        "batch_size": (None, "batch_size"),
        "size": (None, "size.name"),
        **{lever: (None, lever) for lever in LEVERS},
        # a user's file is the data its content is, wherever it lies (data.path is apart)
        "data_digest": ("fxtrack.data_digest", None),
    }


# Columns a reader's frame holds besides params: metrics, tags, a figure's caveat tags
READERS_OWN = ("metrics.", "tags.", "attributes.", "caveat.", "identity.")


def options(frame: pd.DataFrame) -> list[str]:
    """Every param any run of ``frame`` logged that is identity and not a declared column,
    sorted: what is not declared apart (``apart_from_identity``) is identity. ``frame`` a
    ``search_runs`` frame (``params.model.layers``) or one ``read`` built (``model.layers``,
    ``data.name``: then every column not a declared one or a reader's own)."""
    if any(c.startswith("params.") for c in frame.columns):
        names = {c[len("params."):] for c in frame.columns if c.startswith("params.")}
    else:  # a frame ``read`` built: its columns past the declared ones are params
        names = {c for c in frame.columns if "." in c and not c.startswith(READERS_OWN)}
    named = {param for _, param in declared().values() if param}
    return sorted(names - named - set(apart_from_identity()))


def columns(frame: pd.DataFrame) -> list[str]:
    """Every identity column of ``frame``'s runs: the declared ones, then the options."""
    return list(declared()) + options(frame)


def column(frame: pd.DataFrame, tag: Optional[str], param: Optional[str]) -> pd.Series:
    """A run's value of a key from its tag, else its param (None where it logged neither)."""
    out = pd.Series([None] * len(frame), index=frame.index, dtype=object)
    for name in (f"tags.{tag}" if tag else None, f"params.{param}" if param else None):
        if name and name in frame.columns:
            out = out.where(out.notna(), frame[name].astype(object))
    return out


def read(frame: pd.DataFrame) -> pd.DataFrame:
    """The identity of each run of a ``search_runs`` frame, as strings (``-`` where not logged,
    a lever's default where it was not), indexed like ``frame``."""
    out = pd.DataFrame(index=frame.index)
    for col, (tag, param) in declared().items():
        out[col] = column(frame, tag, param)
    # framework.compile as asked: the param holds what ran (true/false); the compile_rule tag
    # says whether that was auto's choice ("auto: ..."), tune's ("tuned: ...") or forced
    if "tags.fxtrack.compile_rule" in frame.columns:
        rule = frame["tags.fxtrack.compile_rule"].astype(object)
        asked = rule.map(lambda r: None if not isinstance(r, str) else
                         "auto" if r.startswith("auto") else
                         "tune" if r.startswith("tuned") else r.rpartition("=")[2])
        out["compile"] = asked.where(asked.notna(), out["compile"])
    for col in options(frame):
        out[col] = frame.get(f"params.{col}", frame.get(col)).astype(object)
    for lever, default in LEVERS.items():
        out[lever] = out[lever].fillna(default)
    out = out.astype(object).where(out.notna(), "-").astype(str)
    out["devices"] = out["devices"].str.replace(r"\.0$", "", regex=True)
    # An aggregate carries no compile_rule tag: it was asked what its repeats were asked
    of, kind = (frame.get(f"tags.fxtrack.{t}") for t in ("repeat_of", "kind"))
    if of is not None and kind is not None and "tags.fxtrack.result_id" in frame:
        asked = dict(zip(of, out["compile"]))
        agg = kind == "aggregate"
        out.loc[agg, "compile"] = [asked.get(r, c) for r, c in
                                   zip(frame.loc[agg, "tags.fxtrack.result_id"], out.loc[agg, "compile"])]
    return out


def repeat_group(frame: pd.DataFrame) -> pd.Series:
    """The repeat group of each run: an aggregate's and its repeats' is the aggregate's result
    id (``fxtrack.repeat_of`` on a repeat); any other run is a group of its own (its run id)."""
    group = frame["run_id"].astype(object)
    for tag in ("tags.fxtrack.result_id", "tags.fxtrack.repeat_of"):
        if tag in frame.columns:
            of = frame[tag].astype(object)
            if tag.endswith("result_id"):  # only an aggregate's result id names a group
                kind = frame.get("tags.fxtrack.kind", pd.Series(None, index=frame.index))
                of = of.where(kind == "aggregate")
            group = of.where(of.notna() & (of.astype(str) != ""), group)
    return group


def size_label(model: str, size: str = "full", dims: Optional[dict[str, str]] = None) -> str:
    """The model named by the dims that ran: ``ViT-B/16`` only at ViT-B/16's dims; ``vit tiny``
    at the tiny preset's; otherwise the size with the dims set apart (``vit tiny (layers=4)``);
    the model's name where no size was logged.
    ``dims``: the ``model.*`` params logged (overrides; ``-`` = not set)."""
    set_dims = {k: v for k, v in (dims or {}).items() if v not in ("-", "", None)}
    if size not in architectures.SIZES:  # no size logged: the dims that ran are not known
        return model + "".join(f" {k}={v}" for k, v in sorted(set_dims.items()))
    try:
        preset = {k: architectures.size_default(model, size, k)
                  for k in architectures.resolve(model).dims}
    except (KeyError, ValueError):  # a user's model or one this version does not know
        return model + "".join(f" {k}={v}" for k, v in sorted(set_dims.items()))
    plain = lambda v: "x".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)  # noqa: E731
    differ = {k: v for k, v in set_dims.items() if k in preset and plain(preset[k]) != str(v)}
    if size == "full" and not differ:
        return architectures.display_name(model)
    words = model if size == "full" else f"{model} {size}"
    return words + (" (" + ", ".join(f"{k}={v}" for k, v in sorted(differ.items())) + ")"
                    if differ else "")


def label_of(config: dict) -> str:
    """``size_label`` of one config (a dict of identity columns, as compare and claims group)."""
    return size_label(str(config.get("model", "")), str(config.get("size", "-")),
                      {k[len("model."):]: v for k, v in config.items() if k.startswith("model.")})


def published(config: dict) -> bool:
    """Whether the config ran its model at the published dims (its label is the model's name)."""
    return label_of(config) == architectures.display_name(str(config.get("model", "")))


def labels(ident: pd.DataFrame) -> pd.Series:
    """Each run's model as its dims name it (``size_label``), from ``read``'s columns."""
    dims = [c for c in ident.columns if c.startswith("model.")]
    return pd.Series([size_label(r["model"], r.get("size", "full"),
                                 {c[len("model."):]: r[c] for c in dims})
                      for _, r in ident.iterrows()], index=ident.index, dtype=object)


def apart(ident: pd.DataFrame, within: list[str]) -> pd.Series:
    """What sets each run apart from the others of its ``within`` group besides the framework:
    ``batch_size=4``, ``scenario.rate=8``, ``compile=true`` ('' where nothing does), so that a
    page showing several identities of one model says which is which."""
    framework = {"framework", *identity_settings(), "model", "size"}
    identity = set(columns_of(ident))
    keys = [c for c in ident.columns if c in identity and c not in framework
            and not c.startswith("model.") and not owned(c) and c not in within]
    out = pd.Series("", index=ident.index, dtype=object)
    for _, group in ident.groupby(within, sort=False, dropna=False):
        varying = [k for k in keys if group[k].nunique() > 1]
        for i, row in group.iterrows():
            out[i] = ", ".join(f"{k}={row[k]}" for k in varying)
    return out


def chosen(modes: tuple[str, ...] = ()) -> set[str]:
    """The identity columns a framework chooses (itself, its identity settings, its compile mode,
    the levers, and an objective's ``modes``, e.g. serve's ``scenario.batching``), besides its
    own ``framework.*`` settings (``owned``): one answer compares its configs; every other
    identity column makes another experiment."""
    return {"framework", *identity_settings(), "compile", *LEVERS, *modes}


def owned(col: str) -> bool:
    """A framework's own setting (``framework.donate``, ``framework.compile_mode``): identity
    within the framework, never held equal across frameworks."""
    return col.startswith("framework.")


def experiment(cols: list[str], modes: tuple[str, ...] = ()) -> list[str]:
    """``cols`` less what a framework chooses: the columns one comparison holds equal."""
    return [c for c in cols if c not in chosen(modes) and not owned(c)]


def across_frameworks(cols: list[str]) -> list[str]:
    """``cols`` for pairing runs of different frameworks (compare's sides, a claim's arms): a
    framework's own settings and its identity settings left out with the framework."""
    return [c for c in cols if not owned(c) and c not in identity_settings()]


def columns_of(ident: pd.DataFrame) -> list[str]:
    """The identity columns present in a frame that ``read`` (or ``samples.configs``) built."""
    names = set(declared()) | set(options(ident))
    return [c for c in ident.columns if c in names]
