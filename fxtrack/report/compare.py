"""``fxtrack compare``: did the candidate runs (new framework version, driver, image, commit)
get slower than the baseline runs?

Each side is the runs an MLflow filter selects. Runs are paired by their comparison identity
(framework, model and its size keys, scenario and its options, precision, devices, device kind,
levers including ``framework.compile``, batch; fxtrack/report/identity.py), leaving out the keys the filters
themselves select on: ``--baseline "params.batch_size = '2'" --candidate "params.batch_size =
'8'"`` pairs batch 2 with batch 8 of the same everything else. On each side a config stands on
its latest aggregate of repeats (its repeats' figures where they are in the store, else the
aggregate's logged interval), or on its latest single run (separate runs never pool). Per pair:
candidate / baseline medians with the 95% Welch interval of the ratio of geometric means
(fxtrack/stats.py, as the report's verdicts), and a verdict that knows which way is better for
the metric.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path
from typing import Optional

import pandas as pd

from fxtrack.config.frameworks import identity_settings
from fxtrack.report.samples import (Sample, configs, describe, identity_columns, lower_is_better,
                                    ratio, sample)
from fxtrack.report.tables import Section, Table, fmt

PROG = "fxtrack compare"
FORMATS = ("md", "csv")
COMPARISONS = "fxtrack-comparisons"  # the experiment --log writes to: never read as benchmarks
DEFAULT_THRESHOLD = 2.0  # % below which a change is "no clear difference" however narrow its interval


def verdict(point: float, interval: Optional[tuple[float, float]], lower_better: bool,
            threshold_pct: float) -> str:
    """regression / improvement / no clear difference, in the metric's own direction."""
    change = point - 1.0
    if abs(change) * 100 <= threshold_pct:
        return "no clear difference"
    worse = change > 0 if lower_better else change < 0
    word = "regression" if worse else "improvement"
    if interval is None:
        return f"{word} (single runs: no interval)"
    if interval[0] <= 1.0 <= interval[1]:
        return "no clear difference"
    return word


@dataclasses.dataclass
class Pair:
    config: dict[str, str]
    base: Sample
    cand: Sample
    ratio: float
    interval: Optional[tuple[float, float]]
    verdict: str

    @property
    def change_pct(self) -> float:
        return (self.ratio - 1.0) * 100

    @property
    def regression(self) -> bool:
        return self.verdict.startswith("regression")


@dataclasses.dataclass
class Comparison:
    metric: str
    lower_better: bool
    identity: list[str]
    pairs: list[Pair]
    only: list[tuple[str, dict[str, str], list[str]]]  # (side, config, run ids)

    def regressions_above(self, pct: float) -> list[Pair]:
        return [p for p in self.pairs if p.regression and abs(p.change_pct) > pct]


def compare(base_frame: pd.DataFrame, cand_frame: pd.DataFrame, metric: str,
            lower_better: bool, identity: list[str],
            threshold_pct: float = DEFAULT_THRESHOLD) -> Comparison:
    """Pair the two sides' configs on ``identity`` and compare ``metric`` in each pair."""
    sides = []
    for frame in (base_frame, cand_frame):
        runs = configs(frame)
        found = {}
        for key, group in runs.groupby(identity, sort=True):
            s = sample(group, runs, metric)
            if s is not None:
                found[key if isinstance(key, tuple) else (key,)] = s
        sides.append(found)
    base, cand = sides
    pairs = []
    for key in sorted(set(base) & set(cand)):
        point, interval = ratio(cand[key], base[key])
        pairs.append(Pair(dict(zip(identity, key)), base[key], cand[key], point, interval,
                          verdict(point, interval, lower_better, threshold_pct)))
    only = [(side, dict(zip(identity, key)), found[key].run_ids)
            for side, found, other in (("baseline", base, cand), ("candidate", cand, base))
            for key in sorted(set(found) - set(other))]
    return Comparison(metric, lower_better, identity, pairs, only)


def _varying(comparison: Comparison) -> list[str]:
    shown = {"framework", *identity_settings(), "model", "scenario", "precision", "devices",
             "hardware"}
    configs_ = [p.config for p in comparison.pairs] + [c for _, c, _ in comparison.only]
    return [k for k in comparison.identity
            if k not in shown and len({c.get(k) for c in configs_}) > 1]


def _short(ids: list[str]) -> str:
    return ", ".join(i[:8] for i in ids[:3]) + (f" +{len(ids) - 3}" if len(ids) > 3 else "")


def tables(comparison: Comparison) -> list[Table]:
    """The pairs' table (with cost columns when the runs logged a cost) and, if any, the
    configs found on one side only."""
    varying = _varying(comparison)
    cost = "cost_per_1m_samples"
    with_cost = cost != comparison.metric and any(
        f"metrics.{cost}" in p.base.rows or f"metrics.{cost}" in p.cand.rows for p in comparison.pairs)
    header = ["config", "baseline", "candidate", "cand/base [95%]", "change", "verdict", "runs"]
    if with_cost:
        header[5:5] = ["cost/1M base", "cost/1M cand"]
    rows = []
    for p in comparison.pairs:
        ratio_cell = f"{p.ratio:.3f}x" + (f" [{p.interval[0]:.3f}, {p.interval[1]:.3f}]"
                                           if p.interval else " (no interval: single runs)")
        row = [describe(p.config, varying), p.base.cell(), p.cand.cell(), ratio_cell,
               f"{p.change_pct:+.1f}%", p.verdict,
               f"{_short(p.base.run_ids)} / {_short(p.cand.run_ids)}"]
        if with_cost:
            row[5:5] = [fmt(_mean(p.base.rows, cost), 4), fmt(_mean(p.cand.rows, cost), 4)]
        rows.append(row)
    direction = "lower" if comparison.lower_better else "higher"
    out = [Table(f"Candidate vs baseline: {comparison.metric} ({direction} is better)", header, rows,
                 ["cand/base = candidate median / baseline median; [95%] = Welch t interval of "
                  "the ratio of geometric means over each side's repeats (fxtrack/stats.py)",
                  "no clear difference: the interval holds 1.00, or the change is within the "
                  "threshold; runs: baseline / candidate run ids (an aggregate's id stands for "
                  "its repeats)"])]
    if comparison.only:
        out.append(Table("Configs on one side only (not compared)", ["side", "config", "runs"],
                         [[side, describe(c, varying), _short(ids)]
                          for side, c, ids in comparison.only]))
    return out


def _mean(rows: pd.DataFrame, key: str) -> Optional[float]:
    col = f"metrics.{key}"
    values = rows[col].dropna() if col in rows else []
    return float(sum(values) / len(values)) if len(values) else None


def frame(comparison: Comparison) -> pd.DataFrame:
    """The pairs as numbers, one row each, for the CSV."""
    return pd.DataFrame([{
        **p.config, "metric": comparison.metric, "lower_is_better": comparison.lower_better,
        "baseline": p.base.point, "baseline_n": p.base.n, "candidate": p.cand.point,
        "candidate_n": p.cand.n, "ratio": p.ratio,
        "ratio_ci_low": p.interval[0] if p.interval else None,
        "ratio_ci_high": p.interval[1] if p.interval else None,
        "change_pct": p.change_pct, "verdict": p.verdict,
        "baseline_runs": " ".join(p.base.run_ids), "candidate_runs": " ".join(p.cand.run_ids),
    } for p in comparison.pairs] + [
        {**c, "metric": comparison.metric, "verdict": f"{side} only",
         f"{side}_runs": " ".join(ids)} for side, c, ids in comparison.only])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Did the candidate runs get slower than the baseline runs? Pairs "
        "each config of the runs two MLflow filters select and states candidate/baseline with "
        "a 95% interval and a verdict. Exit status 1 when a regression exceeds --fail-above.")
    parser.add_argument("--experiment", default="fxtrack", help="MLflow experiment (default: %(default)s)")
    parser.add_argument("--uri", help="tracking URI (default: $MLFLOW_TRACKING_URI, else "
                        "sqlite:///<current directory>/mlflow.db)")
    parser.add_argument("--baseline", required=True, metavar="FILTER",
                        help="MLflow search filter of the baseline runs, e.g. "
                        "\"tags.`fxtrack.framework_version` = '2.12.0'\"")
    parser.add_argument("--candidate", required=True, metavar="FILTER",
                        help="MLflow search filter of the candidate runs")
    parser.add_argument("--metric", default="throughput_samples_per_s",
                        help="metric key to compare (default: %(default)s)")
    way = parser.add_mutually_exclusive_group()
    way.add_argument("--lower-is-better", dest="lower", action="store_true", default=None,
                     help="for a metric fxtrack does not know")
    way.add_argument("--higher-is-better", dest="lower", action="store_false")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, metavar="PCT",
                        help="a change within PCT%% is no clear difference (default: %(default)s)")
    parser.add_argument("--fail-above", type=float, metavar="PCT",
                        help="exit 1 when any regression is larger than PCT%% (for CI)")
    parser.add_argument("--out", type=Path, help="write compare.<format> files here")
    parser.add_argument("--format", default=",".join(FORMATS),
                        help="comma-separated files to write with --out, of md, csv (default: %(default)s)")
    parser.add_argument("--log", action="store_true",
                        help=f"log the comparison as a run in the {COMPARISONS!r} experiment")
    args = parser.parse_args(argv)
    args.formats = [f.strip() for f in args.format.split(",") if f.strip()]
    if not args.formats or set(args.formats) - set(FORMATS):
        parser.error(f"--format takes a comma-separated list of {', '.join(FORMATS)}; got {args.format!r}")
    if args.lower is None:
        try:
            args.lower = lower_is_better(args.metric)
        except ValueError as e:
            parser.error(str(e))
    return args


def main(argv: list[str]) -> int:
    """0: no regression beyond --fail-above; 1: one or more; 2: nothing could be compared."""
    args = parse_args(argv)
    from fxtrack.environment import redact_uri_text
    from fxtrack.report import render
    from fxtrack.tracking import reader, target

    uri = target.tracking_uri(args.uri, os.getcwd())  # credentials moved out (issue 60)
    frames = []
    for side, flt in (("baseline", args.baseline), ("candidate", args.candidate)):
        try:
            frames.append(reader.load_runs(uri, args.experiment, flt))
        except reader.ReadError as e:
            print(f"{PROG}: {side}: {e}", file=sys.stderr)
            return 2
    identity = identity_columns(pd.concat(frames), args.baseline, args.candidate)
    result = compare(*frames, args.metric, args.lower, identity, args.threshold)
    if not result.pairs and not result.only:
        print(f"{PROG}: no run on either side logged {args.metric!r}", file=sys.stderr)
        return 2
    found = tables(result)
    print(f"{PROG}: experiment {args.experiment!r} at {redact_uri_text(uri)}\n"
          f"  baseline:  {args.baseline}\n  candidate: {args.candidate}\n"
          f"  paired on: {', '.join(identity)}\n")
    print(render.text(found))
    failing = result.regressions_above(args.fail_above) if args.fail_above is not None else []
    if args.fail_above is not None:
        print(f"\n{PROG}: {len(failing)} regression(s) larger than {args.fail_above:g}%"
              + (": " + "; ".join(f"{describe(p.config, [])} {p.change_pct:+.1f}%" for p in failing)
                 if failing else ""))
    files = _write(args, result, found, uri) if args.out or args.log else []
    if args.log:
        _log(uri, args, result, files)
    return 1 if failing else 0


def _write(args: argparse.Namespace, result: Comparison, found: list[Table], uri: str) -> list[Path]:
    from fxtrack.environment import redact_uri_text
    from fxtrack.report import render

    out = (args.out or Path(tempfile.mkdtemp(prefix="fxtrack-compare-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    files = []
    if "md" in args.formats:
        report = render.Report(f"fxtrack compare: {result.metric}", [
            f"experiment {args.experiment!r} at {redact_uri_text(uri)}", f"baseline: {args.baseline}",
            f"candidate: {args.candidate}", f"paired on: {', '.join(result.identity)}"],
            [Section("Comparison", found, __doc__.split("\n\n")[1].replace("\n", " "))], [])
        files.append(out / "compare.md")
        files[-1].write_text(render.markdown(report), encoding="utf-8")
    if "csv" in args.formats:
        files.append(out / "compare.csv")
        frame(result).to_csv(files[-1], index=False)
    if args.out:
        print(f"{PROG}: wrote {', '.join(p.name for p in files)} to {out}", file=sys.stderr)
    return files


def _log(uri: str, args: argparse.Namespace, result: Comparison, files: list[Path]) -> None:
    """The comparison as a run of its own experiment, through the one MLflow writer: params say
    what was compared, metrics how it came out, the files are its artifacts."""
    from fxtrack.tracking import records, writer

    params = {"experiment": args.experiment, "baseline": args.baseline,
              "candidate": args.candidate, "metric": args.metric, "threshold_pct": args.threshold,
              "fail_above_pct": args.fail_above, "paired_on": ",".join(result.identity)}
    record = records.report_record(uri, COMPARISONS, params)
    record["run_name"] = f"compare-{args.metric}"
    record["tags"]["fxtrack.kind"] = "comparison"
    changes = [p.change_pct for p in result.pairs]
    record["metrics"] = {"pairs": len(result.pairs), "unpaired": len(result.only),
                         "regressions": sum(p.regression for p in result.pairs),
                         "improvements": sum(p.verdict.startswith("improvement") for p in result.pairs)}
    if changes:
        record["metrics"].update(change_pct_min=min(changes), change_pct_max=max(changes))
    run_id, _, message = writer.log_record(record, {p.name: p for p in files}, uri)
    if run_id is None:
        print(f"{PROG}: the comparison run: {(message or '').removeprefix('fxtrack: ')}",
              file=sys.stderr)
        return
    print(f"{PROG}: logged as MLflow run {run_id} in experiment {COMPARISONS!r}", file=sys.stderr)
