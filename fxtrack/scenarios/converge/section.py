"""The report's time-to-quality section (scenario=converge), by MLPerf Training's rules: each
framework's runs of one model, data and target (``repeats=N`` seeds), a verdict only from five
runs or more, the fastest and the slowest dropped, a missed target counted as slower than any
that reached it (and shown), the mean of the rest with its 95% interval, and each framework's
ratio to the fastest with its Welch interval (fxtrack/stats.py)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

from fxtrack import stats
from fxtrack.report import identity, samples
from fxtrack.report.tables import Section, Table, fmt
from fxtrack.scenarios import of_section

MIN_RUNS = 5  # MLPerf Training's fewest runs for a result (its benchmarks ask 5 to 10)
INTRO = ("Training time to the held-out target (time_to_target_s: the steps' time, evaluation "
         "and compilation excluded). MLPerf Training's rules: at least 5 runs (repeats=5), the "
         "fastest and the slowest dropped, a run that missed the target counts as the slowest "
         "and a missed run among those kept leaves no figure; the mean of the rest with its 95% "
         "interval, and the ratio to the fastest framework with its interval.")


def middle(times: list[Optional[float]]) -> tuple[Optional[list[float]], str]:
    """MLPerf's kept runs of ``times`` (None: missed the target): the fastest and slowest
    dropped; (their times, "") or (None, why there is no figure)."""
    if len(times) < MIN_RUNS:
        return None, f"{len(times)} run(s): needs repeats={MIN_RUNS}"
    ranked = sorted(times, key=lambda t: math.inf if t is None else t)[1:-1]
    missed = sum(t is None for t in ranked)
    if missed:
        return None, f"{missed} of the kept runs missed the target"
    return [float(t) for t in ranked], ""


KEY = "time_to_target_s"
# Sample efficiency apart from step speed (issue 62): from the same start the step counts to a
# target should agree; a framework's steps are "same" as the fastest's when the 90% interval of
# their ratio (two one-sided tests at 5%) lies within this factor either way
SAME_STEPS = 1.10


def sample_efficiency(steps: list[float], reference: list[float]
                      ) -> Optional[tuple[float, Optional[tuple[float, float]], str]]:
    """(ratio of geometric-mean steps to target, its 95% interval, verdict) against the
    reference's: ``same`` (equivalent within SAME_STEPS by TOST), ``more_steps``,
    ``fewer_steps`` (the 90% interval past 1), ``undecided``; None below MIN_RUNS each."""
    if len(steps) < MIN_RUNS or len(reference) < MIN_RUNS:
        return None
    mine, ref = stats.log_summary(steps), stats.log_summary(reference)
    ratio = math.exp(mine[0] - ref[0])
    tost = stats.ratio_interval(mine, ref, level=0.90)
    shown = stats.ratio_interval(mine, ref)
    if tost is None:
        return ratio, shown, "undecided"
    if 1 / SAME_STEPS <= tost[0] and tost[1] <= SAME_STEPS:
        verdict = "same"
    elif tost[0] > 1:
        verdict = "more_steps"
    elif tost[1] < 1:
        verdict = "fewer_steps"
    else:
        verdict = "undecided"
    return ratio, shown, verdict


def groups(frame: pd.DataFrame) -> list[tuple[dict[str, str], list[tuple[str, samples.Sample]]]]:
    """The section's comparisons, each one experiment (every identity column but what a framework
    chooses: ``identity.experiment``) with each config's figure, from the one figure function
    (``samples.sample`` under MLPerf's rule, ``middle``): (the experiment's columns, [(the
    config's words, its figure)]), a config's latest repeat group standing for it."""
    scenario = frame.get("tags.fxtrack.scenario")
    if scenario is None or not scenario.isin(of_section(__name__)).any():
        return []  # no converge run: nothing to read (a frame of other scenarios' runs)
    configs = samples.configs(frame)
    configs = configs[configs["scenario"].isin(of_section(__name__))]
    if configs.empty or "metrics.reached_target" not in configs:
        return []
    if f"metrics.{KEY}" not in configs:  # every run missed: each is a None
        configs = configs.assign(**{f"metrics.{KEY}": float("nan")})
    cols = [c for c in samples.identity_columns(configs) if c in configs]
    held = identity.experiment(cols)
    out = []
    for key, block in configs.groupby(held, sort=True, dropna=False):
        found = []
        apart = identity.apart(block[cols], held)
        for _, one in block.groupby(cols, sort=False, dropna=False):
            figure = samples.sample(one, configs, KEY, middle)
            if figure is None:
                continue
            fw = one["framework"].iloc[-1]
            found.append((fw + (f" ({apart[one.index[-1]]})" if apart[one.index[-1]] else ""),
                          figure))
        if found:
            out.append((dict(zip(held, key if isinstance(key, tuple) else (key,))), found))
    return out


def _steps(own: pd.DataFrame, figure: samples.Sample) -> list[float]:
    """The steps to target of the runs a figure stands on that reached it (not an aggregate)."""
    if "metrics.steps_to_target" not in own:
        return []
    runs = own[~own.index.isin(figure.run_ids)] if len(own) > 1 else own
    return [float(v) for v in runs["metrics.steps_to_target"].dropna() if v > 0]


def title(where: dict[str, str], every: list[dict[str, str]]) -> str:
    """``Time to quality: mlp on data=file (3f2a9c1e), target 0.9 (fp32, cpu)``: the model by
    its dims, the data (a user's file by its content digest), the target, the machine, and any
    other setting that differs between the section's comparisons of the model."""
    label = identity.label_of(where)
    data = where.get("data.name", "-")
    if where.get("data_digest", "-") not in ("-", "") and data == "file":
        data += f" ({where['data_digest'][:8]})"
    named = {"model", "size", "data.name", "data_digest", "scenario.target", "precision",
             "hardware", "scenario"}
    same = [w for w in every if w.get("model") == where.get("model")]
    other = [f"{k}={v}" for k, v in where.items() if k not in named and not k.startswith("model.")
             and len({w.get(k) for w in same}) > 1]
    return (f"Time to quality: {label} on data={data}, target {where.get('scenario.target', '-')}"
            f" ({where.get('precision', '-')}, {where.get('hardware', '-')})"
            + (f" [{', '.join(other)}]" if other else ""))


def section(runs: pd.DataFrame, frame: pd.DataFrame) -> Optional[Section]:
    found = groups(frame)
    if not found:
        return None
    rows_of = frame.set_index("run_id")
    every = [where for where, _ in found]
    tables: list[Table] = []
    for where, figures in found:
        notes: list[str] = []
        ranked = {name: f for name, f in figures if f.log is not None or (f.values and not f.why)}
        best = min(ranked, key=lambda n: ranked[n].point) if ranked else None
        rows = []
        for name, f in sorted(figures):
            reached = sum(v is not None for v in f.values)
            interval = ratio = "-"
            if f.log is not None:
                low, high = f.interval()
                interval = f"[{low:.3g}, {high:.3g}]"
            if name == best:
                ratio = "fastest"
            elif best is not None and name in ranked:
                point, ci = samples.ratio(f, ranked[best])
                ratio = f"{point:.2f}x" + ("" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]")
            own = rows_of.loc[[r for r in f.members if r in rows_of.index]]
            steps = _steps(own, f)
            finals = [v for c in own.columns if c.startswith("metrics.final_eval_")
                      and not c.endswith("_vs_fp32") for v in own[c].dropna()]
            tags = sorted(set(own.get("tags.fxtrack.trajectory", pd.Series(dtype=object))
                              .dropna().astype(str)))
            efficiency = "-"
            if best is not None and name != best:
                found_se = sample_efficiency(steps, _steps(rows_of.loc[[
                    r for r in ranked[best].members if r in rows_of.index]], ranked[best]))
                if found_se is not None:
                    steps_ratio, ci, verdict = found_se
                    efficiency = (f"{verdict}: {steps_ratio:.2f}x steps"
                                  + ("" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]"))
                    time_ratio = f.point / ranked[best].point if name in ranked else None
                    if time_ratio and abs(math.log(time_ratio)) > 1e-9:
                        share = math.log(steps_ratio) / math.log(time_ratio)
                        notes.append(f"{name}: {time_ratio:.2f}x the time of {best}, "
                                     f"{steps_ratio:.2f}x its steps: {share:.0%} of the "
                                     f"difference (in log) is step count, {1 - share:.0%} step "
                                     "speed" + ("" if verdict == "same" else
                                                f"; {verdict}: from the same start the counts "
                                                "should agree, see the trajectory check"))
            rows.append([name, str(len(f.values)), str(reached),
                         "-" if math.isnan(f.point) else f"{f.point:.3g}", interval,
                         ratio, efficiency, fmt(stats.median(finals), 3) if finals else "-",
                         ", ".join(tags) or "-", ", ".join(f.caveats) or "-"])
            if f.earlier:
                notes.append(f"{name}'s latest group ({f.n} runs) stands; an earlier group of "
                             f"{f.earlier} runs of the same config is not pooled with it")
        tables.append(Table(title(where, every),
                            ["framework", "runs", "reached", "time to target s", "95% interval",
                             "ratio to fastest [95%]", "sample efficiency [95%]",
                             "final metric (median)", "trajectory", "caveats"], rows, notes))
        notes = []
    return Section("Time to quality", tables, INTRO)


METRICS = ("accuracy", "loss", "bits_per_byte")


def charts(frame: pd.DataFrame, runs: pd.DataFrame, out: Path,
           histories: Callable[[list[str], list[str]], dict]) -> list:
    """One chart per model, data, target, precision and hardware: each framework's held-out
    metric against its training seconds (``eval_train_s``: evaluation and compilation left
    out), every run a line, the target dashed. ``histories``: (run ids, keys) -> run id -> key
    -> (step, value) points (tracking.reader.metric_histories)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fxtrack.report.charts import Chart, colour

    found = groups(frame)
    if not found:
        return []
    keys = ["eval_train_s", *(f"eval_{m}" for m in METRICS)]
    # each run of the group a figure stands on (an aggregate's repeats, not the aggregate)
    lines = {id(f): [r for r in f.members if len(f.members) == 1 or r not in f.run_ids]
             for _, figures in found for _, f in figures}
    points = histories([r for runs in lines.values() for r in runs], keys)
    drawn = []
    every = [where for where, _ in found]
    for where, figures in found:
        target = where.get("scenario.target")
        heading = title(where, every)
        fig, ax = plt.subplots(figsize=(6.5, 4.4))
        metric = None
        for name, f in sorted(figures):
            fw = name.split(" ")[0]
            for run in lines[id(f)]:
                own = points.get(run, {})
                metric = next((m for m in METRICS if f"eval_{m}" in own), metric)
                if metric is None or "eval_train_s" not in own:
                    continue
                seconds = dict(own["eval_train_s"])
                xy = [(seconds[s], v) for s, v in own[f"eval_{metric}"] if s in seconds]
                labelled = name in ax.get_legend_handles_labels()[1]  # one entry per config
                ax.plot([p[0] for p in xy], [p[1] for p in xy], color=colour(fw), alpha=0.8,
                        label=None if labelled else name)
        if metric is None:
            plt.close(fig)
            continue
        try:
            ax.axhline(float(target), color="grey", linestyle="--", linewidth=1)
        except (TypeError, ValueError):
            pass
        ax.set_xlabel("training seconds (evaluation and compilation excluded)")
        ax.set_ylabel(f"held-out {metric}")
        ax.set_title("\n".join(textwrap.wrap(heading, 70)), fontsize=9)  # never past the figure
        ax.legend(title="framework", fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        name = "".join(c if c.isalnum() else "_" for c in f"converge_{len(drawn)}_{heading[17:60]}")
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        drawn.append(Chart(heading, path, "each line one run of the group its figure stands on "
                                          "(repeats: one per seed); dashed: the target"))
    return drawn


def _converges(entry: dict) -> bool:
    """A converge run's (or aggregate's) entry of a sweep: its figure is the time to a target."""
    return "reached_target" in entry.get("metrics", {})


def closing_table(jobs: list[dict], aggregates: list[dict]) -> str:
    """The sweep's converge runs: each single run's time to target, and each aggregate's by the
    report's rule (``middle``: MLPerf's mean of the middle runs, a missed target the slowest),
    so the terminal and the page give one figure; "" when none."""
    from fxtrack.report.render import text_table

    def held_out(m: dict[str, float]) -> str:
        return next((f"{k[len('final_eval_'):]} {v:.3f}" for k, v in m.items()
                     if k.startswith("final_eval_")), "-")

    rows = []
    for j in jobs:
        if _converges(j) and not j.get("aggregate"):  # a repeat counts in its aggregate's row
            m = j["metrics"]
            rows.append([j["name"], f"{m['reached_target']:.0f}/1",
                         fmt(m.get("time_to_target_s")), fmt(m.get("steps_to_target"), 0),
                         held_out(m), "single run" + ("; contended" if j.get("tags", {}).get(
                             "fxtrack.contended") == "true" else "")])
    for a in filter(_converges, aggregates):
        repeats = [j["metrics"] for j in jobs if j.get("aggregate") == a["id"] and _converges(j)]
        times = [m.get("time_to_target_s") if m["reached_target"] == 1.0 else None
                 for m in repeats]
        reached = sum(t is not None for t in times)
        # the one figure function's rule, as the page pools these repeats (report/samples.py)
        pooled = samples.by_rule(middle, pd.Series(times, dtype=object), [a["id"]], pd.DataFrame())
        figure = None if reached == 0 else pooled.point
        note = pooled.why or f"mean of middle {len(times) - 2} of {len(times)}"
        if a["tags"].get("fxtrack.contended_repeats"):
            note += f"; contended in {a['tags']['fxtrack.contended_repeats']}"
        rows.append([a["name"], f"{reached}/{len(times)}", fmt(figure),
                     fmt(a["metrics"].get("steps_to_target"), 0), held_out(a["metrics"]), note])
    if not rows:
        return ""
    return "\n".join(["", text_table(Table(
        "Time to target (scenario=converge; training seconds, evaluation and compilation "
        "excluded):", ["run", "reached", "to target s", "steps", "held-out", "note"], rows)), ""])
