"""The one comparison identity: when two runs are the same experiment, and which runs pool.

Every reader asks this module: the page's answer and tables (select.py, samples.py), the charts,
``fxtrack compare``, ``fxtrack claims`` and the trend. A run's identity is the framework-neutral
config that changes a figure: the declared columns below (framework and its identity settings,
compile mode, model, scenario, precision, devices, hardware, batch, size, levers), then every
``model.*`` param (the dims set apart from the size) and every ``scenario.*`` param (the
scenario's options: a serve rate, a fit axis, SLOs) a run logged. Runs of one identity are one
experiment; the latest stands. Figures pool only within a repeat group: the repeats one
``repeats=N`` asked for (``fxtrack.repeat_of``), never runs that happen to share parameters.
"""

from __future__ import annotations

from typing import Optional

import pandas as pd

from fxtrack import architectures
from fxtrack.config.frameworks import identity_settings
from fxtrack.scenarios.options import apart_from_identity

# Each lever and its default: runs at the defaults are the main tables' benchmarks.
LEVERS = {"runtime": "native", "quantize": "none", "parallel": "ddp", "memory": "none"}
# Param prefixes whose every key is identity (read from what each run logged, never a list of
# scenario names): the model's dims set apart from its size, the scenario's options.
OPTION_PREFIXES = ("model.", "scenario.")
# Named by a declared column already
NAMED = {"model.name", "scenario.name"}


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
    }


def options(frame: pd.DataFrame) -> list[str]:
    """The ``model.*`` and ``scenario.*`` params any run of ``frame`` logged, sorted; ``frame``
    a ``search_runs`` frame (``params.model.layers``) or one ``read`` built (``model.layers``)."""
    names = {c[len("params."):] if c.startswith("params.") else c for c in frame.columns}
    apart = NAMED | apart_from_identity()  # e.g. train's profile_steps: measured after the figures
    return sorted(n for n in names if n.startswith(OPTION_PREFIXES) and n not in apart)


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
    keys = [c for c in ident.columns if c in columns_of(ident) and c not in framework
            and not c.startswith("model.") and c not in within]
    out = pd.Series("", index=ident.index, dtype=object)
    for _, group in ident.groupby(within, sort=False, dropna=False):
        varying = [k for k in keys if group[k].nunique() > 1]
        for i, row in group.iterrows():
            out[i] = ", ".join(f"{k}={row[k]}" for k in varying)
    return out


def columns_of(ident: pd.DataFrame) -> list[str]:
    """The identity columns present in a frame that ``read`` (or ``samples.configs``) built."""
    names = set(declared())
    return [c for c in ident.columns if c in names or c.startswith(OPTION_PREFIXES)]
