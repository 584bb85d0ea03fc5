"""The toy's report section, with its closing table at the end of a sweep."""

from fxtrack import scenarios
from fxtrack.report.tables import Section, Table


def section(runs, frame):
    toys = runs[runs["scenario"].isin(scenarios.of_section(__name__))] if "scenario" in runs \
        else runs.iloc[0:0]
    if toys.empty:
        return None
    return Section("Toy widgets", [Table("widgets", ["framework"],
                                         [[f] for f in toys["framework"]])], "the toy's own")


def closing_table(jobs, aggregates):
    made = [j for j in jobs if "toy_widgets" in j.get("metrics", {})]
    return "".join(f"\n{j['name']}: {j['metrics']['toy_widgets']:g} widgets\n" for j in made)
