"""``fxtrack claims``: are the figures in the articles and vendor tables true on our hardware?

The claims are data (fxtrack/claims.yaml, shipped with the package; its header says what each
field means). For each claim the runs in MLflow that match it are grouped so that its arms
(frameworks, or a lever on and off) differ in nothing else, and the claim gets one verdict:

- *consistent*: the measured figure's (or ratio's) 95% interval meets the published figure, read
  to the precision it was printed with (312 means 311.5-312.5; a stated ``tolerance`` widens it);
- *contradicted*: it does not; by how much, with the interval;
- *not testable here*: the figure needs other hardware (the claimed device), or only single runs
  exist (no interval); the ratio form measured here is shown where there is one;
- *not yet measured*: no runs of its arms; with the command that would measure them.

Ratios and lever effects use the report's Welch interval (fxtrack/report/samples.py, stats.py);
an absolute figure uses the Student-t interval of its repeats' log values. Each verdict cites the
run ids it stands on.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from fxtrack import metrics as registry
from fxtrack.config.frameworks import identity_settings
from fxtrack.report import identity
from fxtrack.report.claim_plans import REPEATS, config_keys, machine_kind, plan
from fxtrack.report.samples import Sample, configs, identity_columns, ratio, sample
from fxtrack.report.tables import Section, Table

PROG = "fxtrack claims"
CLAIMS = Path(__file__).resolve().parents[1] / "claims.yaml"
KINDS = ("absolute", "ratio", "memory", "lever")
TESTS = ("on_device", "anywhere")
CONSISTENT, CONTRADICTED = "consistent", "contradicted"
UNTESTABLE, UNMEASURED = "not testable here", "not yet measured"
# published unit -> (the registry's unit of the metric it converts to, the factor)
UNITS = {"GB": ("MiB", 1e9 / 2**20)}
REQUIRED = ("id", "source", "claim", "kind", "metric", "arms", "conditions", "test")
CONDITIONS = ("model", "scenario", "hardware", "device", "precision", "batch_size", "devices",
              "framework_versions")


@dataclasses.dataclass
class Claim:
    id: str
    source: dict[str, Any]
    claim: str
    kind: str
    metric: str
    arms: list[dict[str, Any]]
    conditions: dict[str, Any]
    test: str
    ratio: Any = None  # a number, "1/N", or None (then arm 1 / arm 2 of the published values)
    tolerance: Optional[float] = None  # relative; None: the printed precision of the figures
    fallback: Optional[str] = None
    unit: Optional[str] = None

    @property
    def arm_keys(self) -> list[str]:
        return sorted({k for arm in self.arms for k in arm if k != "value"})

    def label(self, arm: dict[str, Any]) -> str:
        """``tensorflow``, ``keras[jax]``, ``torch compile=true`` ..."""
        fw = str(arm.get("framework", ""))
        settings = identity_settings()
        for key in settings:
            if key in arm:
                fw += f"[{arm[key]}]"
        rest = [f"{k}={arm[k]}" for k in self.arm_keys if k not in ("framework", *settings)
                and k in arm]
        return " ".join(p for p in [fw, *rest] if p)

    def scale(self) -> float:
        """Published unit -> the metric's unit."""
        return UNITS[self.unit][1] if self.unit else 1.0


def _at(e: Any) -> str:
    """Where in the file a YAML error is, ``, line L column C``, or nothing."""
    mark = getattr(e, "problem_mark", None)
    return "" if mark is None else f", line {mark.line + 1} column {mark.column + 1}"


def load(path: Path = CLAIMS) -> list[Claim]:
    """The claims file, validated: ValueError names the entry and what is wrong with it."""
    import yaml

    try:
        entries = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    except yaml.constructor.ConstructorError as e:  # a !!python/... tag: nothing is run
        raise ValueError(f"{path}: not plain YAML data ({e.problem}{_at(e)}); a claims file "
                         "holds mappings, lists, strings and numbers only") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({getattr(e, 'problem', None) or e}{_at(e)})"
                         ) from None
    if entries is not None and not isinstance(entries, list):
        raise ValueError(f"{path}: a claims file is a list of claims, got a "
                         f"{type(entries).__name__}")
    claims, seen = [], set()
    for i, entry in enumerate(entries or []):
        where = f"{path.name} entry {i} ({entry.get('id', '?') if isinstance(entry, dict) else '?'})"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: not a mapping")
        missing = [k for k in REQUIRED if entry.get(k) in (None, "", [], {})]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        unknown = set(entry) - {f.name for f in dataclasses.fields(Claim)}
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        claim = Claim(**entry)
        if claim.id in seen:
            raise ValueError(f"{where}: duplicate id")
        seen.add(claim.id)
        if not claim.source.get("title") or "section" not in claim.source:
            raise ValueError(f"{where}: source needs a title and a section")
        if claim.kind not in KINDS or claim.test not in TESTS:
            raise ValueError(f"{where}: kind must be one of {KINDS}, test one of {TESTS}")
        if set(CONDITIONS) - set(claim.conditions):
            raise ValueError(f"{where}: conditions need {', '.join(CONDITIONS)} (null: not stated)")
        bad = [k for arm in claim.arms for k in arm if k != "value" and k not in config_keys()]
        if len(claim.arms) < 2 or bad:
            raise ValueError(f"{where}: needs two or more arms keyed by {', '.join(config_keys())}"
                             + (f"; unknown {', '.join(bad)}" if bad else ""))
        if claim.kind in ("ratio", "lever") and (len(claim.arms) != 2 or (
                claim.ratio is None and not all("value" in a for a in claim.arms))):
            raise ValueError(f"{where}: a {claim.kind} claim has two arms and a ratio (or both values)")
        if claim.kind in ("absolute", "memory") and not all("value" in a for a in claim.arms):
            raise ValueError(f"{where}: an {claim.kind} claim gives every arm's value")
        unknown = [m for m in (claim.metric, claim.fallback) if m and registry.lookup(m) is None]
        if unknown:
            raise ValueError(f"{where}: {unknown[0]!r} is not a metric fxtrack logs "
                             "(fxtrack/metrics.py)")
        registered = registry.lookup(claim.metric)
        if claim.unit is not None and claim.unit not in UNITS:
            raise ValueError(f"{where}: unit must be one of {', '.join(UNITS)}")
        if claim.unit is not None and UNITS[claim.unit][0] != registered.unit:
            raise ValueError(f"{where}: a figure in {claim.unit} converts to "
                             f"{UNITS[claim.unit][0]}, but {claim.metric} is in {registered.unit}")
        claims.append(claim)
    return claims


def _half_unit(value: float) -> float:
    """Half a unit in the last printed digit: 312 -> 0.5, 5.8 -> 0.05, 0.25 -> 0.005."""
    text = repr(value)
    decimals = len(text.split(".")[1]) if "." in text and "e" not in text else 0
    if decimals == 1 and text.endswith(".0"):
        decimals = 0
    return 0.5 * 10 ** -decimals


def expected_ratio(claim: Claim, devices: int) -> tuple[float, float]:
    """(published arm 1 / arm 2, its relative half-width) for a ratio or lever claim."""
    if isinstance(claim.ratio, str) and claim.ratio.replace(" ", "") == "1/N":
        return 1.0 / devices, claim.tolerance or 0.0
    if claim.ratio is not None:
        value = float(claim.ratio)
        return value, claim.tolerance or _half_unit(value) / value
    a, b = (float(arm["value"]) for arm in claim.arms)
    return a / b, claim.tolerance or _half_unit(a) / a + _half_unit(b) / b


@dataclasses.dataclass
class Verdict:
    claim: Claim
    status: str
    detail: str
    run_ids: list[str] = dataclasses.field(default_factory=list)
    machine: str = "cpu"  # the machine kind its commands are planned for

    @functools.cached_property
    def commands(self) -> list[str]:
        """The lines that would measure the claim here, each checked as a run is (a Hydra
        composition per cell: seconds for all claims). Planned when asked, by ``claims``: the
        report's section shows verdicts only, and planned them for nothing at every sweep's end."""
        return plan(self.claim, self.machine)


@dataclasses.dataclass
class Group:
    """Runs in which every arm of a claim was measured with nothing else differing."""

    config: dict[str, str]
    samples: list[Optional[Sample]]  # per arm; None: that arm has no runs here
    rows: pd.DataFrame

    @property
    def complete(self) -> bool:
        return all(s is not None for s in self.samples)

    @property
    def run_ids(self) -> list[str]:
        return [i for s in self.samples if s for i in s.run_ids]


def _matches_arm(rows: pd.DataFrame, arm: dict[str, Any]) -> pd.DataFrame:
    for key, value in arm.items():
        if key != "value":
            rows = rows[rows[key] == str(value).lower() if key == "compile" else rows[key] == str(value)]
    return rows


def _device_matches(device: str, wanted: str) -> bool:
    """``A100 80GB`` matches ``NVIDIA A100-SXM4-80GB``: every word of it is in the device name."""
    name = str(device).lower().replace("-", " ")
    return all(word.lower() in name for word in wanted.split())


def groups(claim: Claim, frame: pd.DataFrame, metric: Optional[str] = None) -> list[Group]:
    """Every group of runs holding at least one arm of ``claim`` for ``metric``."""
    metric = metric or claim.metric
    if frame.empty:
        return []
    runs = configs(frame)
    cond = claim.conditions
    if cond.get("model"):
        runs = runs[runs["model"] == cond["model"]]
    if cond.get("scenario"):
        runs = runs[runs["scenario"] == cond["scenario"]]
    for lever, default in identity.LEVERS.items():  # a lever no arm sets stays at its default
        if lever not in claim.arm_keys:
            runs = runs[runs[lever] == default]
    keys = [c for c in identity_columns(frame) if c not in claim.arm_keys]
    if "framework" in claim.arm_keys:  # arms that differ by framework: not by its own settings
        keys = identity.across_frameworks(keys)
    found = []
    for values, rows in (runs.groupby(keys, sort=False) if len(runs) else []):
        arms = [sample(_matches_arm(rows, arm), runs, metric) if len(_matches_arm(rows, arm))
                else None for arm in claim.arms]
        if any(arms):
            found.append(Group(dict(zip(keys, values)), arms, rows))
    return found


def _on_claimed_hardware(claim: Claim, group: Group) -> Optional[str]:
    """None when ``group`` ran under the claim's conditions, else what it lacks."""
    cond, conf = claim.conditions, group.config
    if cond.get("hardware") and conf.get("hardware") != cond["hardware"]:
        return f"needs a {cond['hardware'].upper()}" + (f" ({cond['device']})" if cond.get("device") else "")
    if cond.get("device") and not any(_device_matches(d, cond["device"]) for d in group.rows["device"].dropna()):
        return f"needs an {cond['device']}"
    for key in ("precision", "batch_size", "devices"):
        if cond.get(key) is not None and key not in claim.arm_keys and conf.get(key) != str(cond[key]):
            return f"needs {key}={cond[key]} (these runs: {conf.get(key)})"
    return None


def _score(claim: Claim, group: Group) -> tuple:
    """Prefer the claimed hardware, then the claim's stated settings, the full-size model, the
    most repeats, the latest runs."""
    cond = claim.conditions
    stated = sum(cond.get(k) is not None and group.config.get(k) == str(cond[k])
                 for k in ("precision", "batch_size", "devices", "hardware"))
    n = sum(s.n for s in group.samples if s)
    return (group.complete, _on_claimed_hardware(claim, group) is None, stated,
            identity.published(group.config), n, group.rows["start_time"].max())


def _under(group: Group) -> str:
    """Where a group was measured: ``cpu (AMD EPYC), fp32, batch 2, vit tiny, torch 2.13.0``
    (the model as the dims that ran name it: "size full" of a 2-layer run would mislead)."""
    c, rows = group.config, group.rows
    devices = ", ".join(sorted({str(d) for d in rows["device"].dropna()})) or "?"
    versions = ", ".join(sorted({f"{f} {v}" for f, v in zip(rows["framework"], rows["framework_version"])
                                 if v is not None}))
    parts = [f"{c.get('hardware', '?')} ({devices})", c.get("precision"),
             f"batch {c['batch_size']}" if c.get("batch_size", "-") != "-" else None,
             f"x{c['devices']}" if "devices" in c else None, identity.label_of(c), versions]
    return ", ".join(p for p in parts if p and p != "-")


def _ratio_text(label: str, point: float, interval: Optional[tuple[float, float]]) -> str:
    return f"{label} is {point:.2f}x" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval
                                         else " (single runs: no interval)")


def _ratio_form(claim: Claim, group: Group) -> str:
    """Each measured arm as a ratio to the first measured one, beside the published ratio."""
    measured = [(arm, s) for arm, s in zip(claim.arms, group.samples) if s]
    if len(measured) < 2:
        arm, s = measured[0]
        return f"only {claim.label(arm)} measured here: {s.point:,.4g}"
    (ref_arm, ref), out = measured[0], []
    for arm, s in measured[1:]:
        point, interval = ratio(s, ref)
        text = _ratio_text(f"{claim.label(arm)}/{claim.label(ref_arm)}", point, interval)
        if "value" in arm and "value" in ref_arm:
            text += f" (published {float(arm['value']) / float(ref_arm['value']):.2f}x)"
        out.append(text)
    return "; ".join(out)


def _meets(interval: tuple[float, float], value: float, rel: float) -> bool:
    return interval[0] <= value * (1 + rel) and interval[1] >= value * (1 - rel)


def _judge_ratio(claim: Claim, group: Group) -> tuple[str, str]:
    devices = int(group.config.get("devices", "1")) if group.config.get("devices", "-") != "-" else \
        max(int(a.get("devices", 1)) for a in claim.arms)
    want, rel = expected_ratio(claim, devices)
    point, interval = ratio(group.samples[0], group.samples[1])
    label = f"{claim.label(claim.arms[0])}/{claim.label(claim.arms[1])}"
    text = _ratio_text(label, point, interval) + f", published {want:.3g}x"
    if interval is None:
        return UNTESTABLE, f"{text}; single runs have no interval: measure with repeats={REPEATS}"
    if _meets(interval, want, rel):
        if interval[1] > 2 * interval[0]:  # agrees, but so would half or twice the figure
            text += f"; the interval is wide: repeats={REPEATS} or more would narrow it"
        return CONSISTENT, text
    off = point / want - 1
    return CONTRADICTED, f"{text}: {abs(off):.0%} {'above' if off > 0 else 'below'} it"


def _judge_figures(claim: Claim, group: Group) -> tuple[str, str]:
    parts, status = [], CONSISTENT
    for arm, s in zip(claim.arms, group.samples):
        want = float(arm["value"]) * claim.scale()
        interval = s.interval()
        text = (f"{claim.label(arm)} {s.point:,.4g}" + (f" [{interval[0]:,.4g}, {interval[1]:,.4g}]"
                                                       if interval else "") + f" vs {want:,.4g}")
        if interval is None:
            status = UNTESTABLE if status == CONSISTENT else status
            text += " (single runs: no interval)"
        elif not _meets(interval, want, claim.tolerance or _half_unit(float(arm["value"])) / float(arm["value"])):
            status = CONTRADICTED
            text += f" ({s.point / want - 1:+.0%})"
        parts.append(text)
    return status, "; ".join(parts)


def evaluate(claim: Claim, frame: pd.DataFrame, machine: str) -> Verdict:
    """The claim's verdict from the runs of ``frame`` (a ``search_runs`` layout)."""
    rank = lambda found: sorted(found, key=lambda g: _score(claim, g), reverse=True)  # noqa: E731
    found, metric = rank(groups(claim, frame)), claim.metric
    if claim.fallback and not any(sum(s is not None for s in g.samples) > 1 for g in found):
        # e.g. no device-memory figure on a CPU: the ratio form may still stand on peak RSS
        alt = rank(groups(claim, frame, claim.fallback))
        found, metric = (alt, claim.fallback) if alt else (found, metric)
    if not found:
        return Verdict(claim, UNMEASURED, "no runs of its arms yet", [], machine)
    best = found[0]
    lacking = _on_claimed_hardware(claim, best)
    where = f"measured on {_under(best)}"
    if claim.test == "on_device" and lacking:
        return Verdict(claim, UNTESTABLE, f"{lacking}; here ({_under(best)}, {metric}) "
                       f"{_ratio_form(claim, best)}", best.run_ids, machine)
    if metric != claim.metric:  # the claimed hardware, but only the fallback figure: no verdict
        return Verdict(claim, UNTESTABLE, f"no {claim.metric} in these runs; {metric} "
                       f"{_ratio_form(claim, best)}; {where}", best.run_ids, machine)
    if not best.complete:
        missing = [claim.label(a) for a, s in zip(claim.arms, best.samples) if s is None]
        return Verdict(claim, UNMEASURED, f"{', '.join(missing)} not measured yet ({where})",
                       best.run_ids, machine)
    if claim.kind in ("ratio", "lever"):
        status, text = _judge_ratio(claim, best)
    else:
        status, text = _judge_figures(claim, best)
    return Verdict(claim, status, f"{text}; {where}", best.run_ids, machine)


# --- the report section and the command -------------------------------------------------------

def verdicts(frame: pd.DataFrame, claims: Optional[list[Claim]] = None,
             machine: Optional[str] = None) -> list[Verdict]:
    return [evaluate(c, frame, machine or machine_kind()) for c in (claims or load())]


def published(claim: Claim) -> str:
    """The claim's published figures in one cell: ``torch 312, jax 345 (throughput_samples_per_s)``
    and its stated ratio, so that a reader sees them beside the measured ones."""
    figures = [f"{claim.label(arm)} {arm['value']:,}" if isinstance(arm.get("value"), (int, float))
               else f"{claim.label(arm)} {arm['value']}" for arm in claim.arms if "value" in arm]
    text = ", ".join(figures) + (f" ({claim.unit or claim.metric})" if figures else "")
    if claim.ratio is not None:
        text += ("; " if text else "") + f"ratio {claim.ratio}"
    return text or "-"


def table(found: list[Verdict]) -> Table:
    rows = [[v.claim.id, v.claim.kind, v.claim.claim, published(v.claim), v.status, v.detail,
             ", ".join(i[:8] for i in v.run_ids) or "-"] for v in found]
    return Table("Published claims on these runs",
                 ["claim", "kind", "says", "published", "verdict", "measured", "runs"], rows,
                 ["consistent / contradicted: the 95% interval of the measured figure or ratio "
                  "against the published one, read to its printed precision",
                  "not testable here: the figure needs the claimed hardware, or the runs are "
                  "single (no interval); the ratio form measured here is shown",
                  "sources: fxtrack/claims.yaml; `fxtrack claims --plan` prints the commands "
                  "that measure what is missing"])


def section(frame: pd.DataFrame, measured_only: bool = True) -> Optional[Section]:
    """The report's section: every claim the runs say something about (all with
    ``measured_only=False``); None when there is none."""
    found = [v for v in verdicts(frame) if not measured_only or v.status != UNMEASURED]
    if not found:
        return None
    return Section("Published claims", [table(found)], __doc__.split("\n\n")[1].replace("\n", " "))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Check published benchmark claims (fxtrack/claims.yaml) against "
        "the runs in MLflow: consistent, contradicted, not testable here, or not yet measured.")
    parser.add_argument("--experiment", default="fxtrack", help="MLflow experiment (default: %(default)s)")
    parser.add_argument("--uri", help="tracking URI (default: $MLFLOW_TRACKING_URI, else "
                        "sqlite:///<current directory>/mlflow.db)")
    parser.add_argument("--plan", action="store_true",
                        help="print the commands that would measure what is not yet measured")
    parser.add_argument("--only", action="append", metavar="ID", help="check only this claim (repeatable)")
    parser.add_argument("--claims", type=Path, default=CLAIMS, help="claims file (default: the packaged one)")
    parser.add_argument("--out", type=Path, help="also write claims.md here")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    """0 when the claims were checked (whatever their verdicts); 2 when the runs cannot be read."""
    args = parse_args(argv)
    from fxtrack.environment import redact_uri_text
    from fxtrack.report import render
    from fxtrack.tracking import reader, target

    try:
        claims = load(args.claims)
    except ValueError as e:  # the file, or one entry, says what is wrong: one line
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    if args.only:
        unknown = set(args.only) - {c.id for c in claims}
        if unknown:
            print(f"{PROG}: no claim {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        claims = [c for c in claims if c.id in args.only]
    uri = target.tracking_uri(args.uri, os.getcwd())  # credentials moved out (issue 60)
    try:
        frame = reader.load_runs(uri, args.experiment)
    except (reader.ExperimentNotFound, reader.NoRunsFound) as e:
        print(f"{PROG}: {e}: nothing measured yet", file=sys.stderr)
        frame = pd.DataFrame()
    except reader.ReadError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    machine = machine_kind()
    found = verdicts(frame, claims, machine)
    if args.plan:
        todo = [v for v in found if v.status in (UNMEASURED, UNTESTABLE)]
        print(f"# {PROG} --plan: {len(todo)} of {len(found)} claims need runs ({machine} machine)")
        for v in todo:
            print(f"\n# {v.claim.id} ({v.status}): {v.claim.claim}")
            print("\n".join(v.commands))
        return 0
    print(f"{PROG}: experiment {args.experiment!r} at {redact_uri_text(uri)}, {len(found)} claims\n")
    print(render.text([table(found)]))
    for v in found:
        if v.status == UNMEASURED:
            print(f"\nto measure {v.claim.id}:\n  " + "\n  ".join(v.commands))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        report = render.Report("fxtrack claims", [f"experiment {args.experiment!r} at {redact_uri_text(uri)}"],
                               [Section("Published claims", [table(found)],
                                        __doc__.split("\n\n")[1].replace("\n", " "))], [])
        (args.out / "claims.md").write_text(render.markdown(report), encoding="utf-8")
    return 0
