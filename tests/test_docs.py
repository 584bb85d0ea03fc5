"""docs/contract.md against the code: every metric key the code writes (found by reading the
source, and taken from a real worker run), every tag, every schema key and every sub-command
with its options must be documented there; the README's commands stay those CI runs; no file
points at a design document the repository does not ship; links in the docs resolve."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import io
import itertools
import re
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fxtrack"
CONTRACT = ROOT / "docs" / "contract.md"
# --- reading the contract ---------------------------------------------------------------------

def section(title: str) -> str:
    """The text of the contract's ``## title`` section (its ### subsections included)."""
    text = CONTRACT.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"docs/contract.md has no '## {title}' section"
    return match.group(1)


def table_rows(text: str) -> list[list[str]]:
    """The cells of every table row (separator rows excluded), ``\\|`` kept inside a cell."""
    return [re.split(r"(?<!\\)\|", line)[1:-1] for line in text.splitlines()
            if line.startswith("|") and not re.fullmatch(r"[|\s:-]+", line)]


def first_column_names(text: str) -> list[str]:
    """The backticked names in the first cell of every table row (header rows excluded)."""
    names = [n.replace("\\|", "|") for cells in table_rows(text)
             for n in re.findall(r"`([^`]+)`", cells[0])]
    headers = {"metric", "tag", "key", "group", "option", "command", "variable"}
    return [n for n in names if n not in headers]


def matcher(names: list[str]) -> re.Pattern:
    """One regex for documented names in the contract's notation (fxtrack.metrics.notation)."""
    from fxtrack.metrics import notation

    return re.compile("|".join(f"(?:{notation(n)})" for n in names))


def undocumented(keys: set[str], names: list[str]) -> list[str]:
    pattern = matcher(names)
    return sorted(k for k in keys if not pattern.fullmatch(k))


# --- metric keys, from the source -------------------------------------------------------------

# Names a metric dict goes by where the code writes metric keys; ``out`` / ``totals`` only inside
# functions that build metrics (``*metrics``, ``window_figures``), where they mean exactly that.
METRIC_NAMES = {"m", "metrics", "result.metrics", "outcome.metrics", "checked"}
LOCAL_NAMES = {"out", "totals"}
# Names written into one key at a time only (scenario=serve's window figures; a whole dict of that
# name is a request's own figures, not metrics).
SUBSCRIPT_NAMES = {"figures", "reported.figures"}
# Only readers of metrics (report), the schema and the transport to MLflow live here.
NOT_WRITERS = {"report", "config", "tracking"}


def _families() -> dict[str, list[str]]:
    """The f-string keys the code writes, each expanded from the values it is formatted with.
    A new f-string key must be added here: the scan cannot guess its values."""
    from fxtrack.frameworks import profiling
    from fxtrack.measure import complexity
    from fxtrack.measure.host_load import LoadSampler
    from fxtrack.scenarios.pipeline import runner as pipeline

    prefix = inspect.signature(LoadSampler.metrics).parameters["prefix"].default
    code = sorted(complexity.code_metrics("torch"))
    # The resident window's throughput is renamed to resident_samples_per_s straight away.
    resident = [f"resident_{k}" for k in pipeline._WINDOW_KEYS if k != "throughput_samples_per_s"]
    return {
        "f'code_{name}'": [k for k in code if k.count("_") == 1],
        "f'code_{name}_{dimension}'": [k for k in code if k.count("_") == 2],
        "f'{prefix}other_cpu_frac'": [f"{prefix}other_cpu_frac"],
        "f'{prefix}steal_frac'": [f"{prefix}steal_frac"],
        "f'{prefix}loadavg_1m'": [f"{prefix}loadavg_1m"],
        "f'speedup_x{n}'": ["speedup_x1", "speedup_x8"],
        "f'scaling_efficiency_x{n}'": ["scaling_efficiency_x1", "scaling_efficiency_x8"],
        "f'throughput_samples_per_s_x{n}'": ["throughput_samples_per_s_x1",
                                            "throughput_samples_per_s_x8"],
        "f'{label}_latency_ms_p50'": ["live_latency_ms_p50", "export_latency_ms_p50"],
        "f\"final_eval_{s['metric']}\"": ["final_eval_accuracy", "final_eval_loss",
                                            "final_eval_bits_per_byte"],
        "f'latency_ms_p{q}'": ["latency_ms_p50", "latency_ms_p90", "latency_ms_p99"],
        "f'profile_{category}_ms'": [f"profile_{c}_ms" for c in profiling.CATEGORIES],
        "f'resident_{key}'": resident,
        "f'resident_{k}'": resident,
        "f'serve_{name}_ms_p{q}'": [f"serve_{n}_ms_p{q}" for n in ("e2e", "queue", "service", "ttft",
                                                               "tpot", "itl")
                                 for q in (50, 90, 99)],
        "f'serve_probe_{k}'": ["serve_probe_serve_e2e_ms_p99", "serve_probe_serve_tpot_ms_p99",
                               "serve_probe_goodput_rps"],
    }


def _comprehension_targets(fn: ast.AST) -> set[str]:
    return {n.id for c in ast.walk(fn) if isinstance(c, ast.comprehension)
            for n in ast.walk(c.target) if isinstance(n, ast.Name)}


def _key_nodes(fn: ast.FunctionDef) -> list[ast.AST]:
    """The key expressions of every metric write inside ``fn``."""
    local = LOCAL_NAMES if fn.name.endswith(("metrics", "figures")) else set()
    names = METRIC_NAMES | local

    def dict_keys(value: ast.AST) -> list[ast.AST]:
        if isinstance(value, ast.Dict):
            return [k for k in value.keys if k is not None]
        return [value.key] if isinstance(value, ast.DictComp) else []

    keys: list[ast.AST] = []
    for n in ast.walk(fn):
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                if isinstance(t, ast.Subscript) and ast.unparse(t.value) in names | SUBSCRIPT_NAMES:
                    keys.append(t.slice)
                elif isinstance(t, ast.Name) and t.id in names:
                    keys += dict_keys(n.value)
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and ast.unparse(n.func.value) in names):
            if n.func.attr == "update":
                keys += [ast.Constant(k.arg) for k in n.keywords if k.arg]
                for arg in n.args:
                    keys += dict_keys(arg)
            elif n.func.attr == "setdefault" and n.args:
                keys.append(n.args[0])
        elif isinstance(n, ast.Return) and fn.name.endswith("metrics") and n.value is not None:
            keys += dict_keys(n.value)
    return keys


def scanned_metric_keys() -> set[str]:
    """Every metric key written in fxtrack/, f-string families expanded (see _families)."""
    families = _families()
    keys: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] in NOT_WRITERS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            assigned = {t.id: n.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
                        for t in n.targets if isinstance(t, ast.Name)}
            passthrough = _comprehension_targets(fn)
            for node in _key_nodes(fn):
                where = f"{path.relative_to(ROOT)}:{node.lineno if hasattr(node, 'lineno') else '?'}"
                if isinstance(node, ast.Name) and node.id in assigned:
                    node = assigned[node.id]
                elif isinstance(node, ast.Name) and node.id in passthrough:
                    continue  # re-keys metrics already written elsewhere (medians, filters)
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    keys.add(node.value)
                elif isinstance(node, ast.JoinedStr):
                    source = ast.unparse(node)
                    assert source in families, (
                        f"{where}: metric key {source} is new: add its values to _families()")
                    keys.update(families[source])
                else:
                    pytest.fail(f"{where}: cannot tell which metric key {ast.unparse(node)} is")
    return keys


def test_the_scan_finds_the_metrics_it_must():
    keys = scanned_metric_keys()
    assert len(keys) > 40, f"the metric scan found only {sorted(keys)}"
    # One key from each kind of writer: timer, scenario, orchestrator, measure, aggregate.
    assert {"throughput_samples_per_s", "input_bound_fraction", "scaling_efficiency", "mfu",
            "throughput_ci_low", "code_sloc_model", "host_other_cpu_frac"} <= keys


def test_every_metric_the_code_writes_is_in_the_contract():
    from fxtrack.measure import cost

    # cost metrics are named in a table (rate -> cost key), which the scan does not read
    keys = scanned_metric_keys() | set(cost.RATES.values())
    missing = undocumented(keys, first_column_names(section("Metrics")))
    assert not missing, f"metric keys missing from docs/contract.md's Metrics tables: {missing}"


# --- the metric registry (fxtrack/metrics.py) against the contract and the code ----------------

def _keys(name: str) -> set[str]:
    """A contract name's concrete keys: ``{a|b}`` each alternative, ``{N}`` the counts 1 and 8."""
    parts = re.split(r"(\{[^}]*\})", name)
    options = [[p] if not p.startswith("{") else ["1", "8"] if p == "{N}" else p[1:-1].split("|")
               for p in parts]
    return {"".join(c) for c in itertools.product(*options)}


def _subsection_scenarios(title: str) -> set[str]:
    """The scenarios a Metrics subsection's title names: 'scenario=train (and scaling
    children)', 'Every timed run (train, inference, ...)', 'Aggregate runs'."""
    if title.startswith("Aggregate"):
        return {"aggregate"}
    named = re.findall(r"scenario=(\w+)", title)
    if title.startswith("Every "):  # Every timed run (...), Every measured window (...)
        named = re.findall(r"(\w+)(?:,| children|\))", title.partition("(")[2])
    return set(named) | ({"scaling"} if "scaling children" in title else set())


def contract_metrics() -> dict[str, tuple[str, set[str]]]:
    """Every concrete metric key of the contract's Metrics tables (MLflow's system series
    left out) -> (the unit cell up to any parenthesis, the scenarios of its subsections)."""
    out: dict[str, tuple[str, set[str]]] = {}
    for block in re.split(r"^### ", section("Metrics"), flags=re.MULTILINE)[1:]:
        title = block.splitlines()[0]
        if title.startswith("System"):
            continue
        scenarios = _subsection_scenarios(title)
        assert scenarios, f"cannot tell the scenarios of the Metrics subsection {title!r}"
        for row in table_rows(block):
            cells = [c.strip().replace("\\|", "|") for c in row]
            unit = cells[1].split(" (")[0]
            for name in re.findall(r"`([^`]+)`", cells[0].replace("\\|", "|")):
                if name != "metric":
                    for key in _keys(name):
                        _, before = out.get(key, (unit, set()))
                        out[key] = (unit, before | scenarios)
    return out


def test_the_metric_registry_is_the_contracts_metrics_tables_units_and_scenarios_included():
    from fxtrack import metrics

    documented = contract_metrics()
    assert len(documented) > 100 and "serve_tpot_ms_p99" in documented
    registered = {key: m for m in metrics.registered() for key in _keys(m.name)}
    assert sorted(set(documented) - set(registered)) == [], "documented, not registered"
    assert sorted(set(registered) - set(documented)) == [], "registered, not documented"
    for key, (unit, scenarios) in documented.items():
        entry = registered[key]
        assert entry.direction in (metrics.LOWER, metrics.HIGHER, metrics.NEITHER), key
        assert set(entry.scenarios) == scenarios, (key, entry.scenarios, scenarios)
        if entry is not metrics.lookup(key):  # a resident_ key reads as its unprefixed key
            assert unit == "as the unprefixed key" and metrics.lookup(key).unit != unit, key
        else:
            assert entry.unit == unit, (key, entry.unit, unit)


def test_every_key_the_code_writes_is_registered_and_every_registered_key_is_written():
    from fxtrack import metrics
    from fxtrack.measure import cost

    written = scanned_metric_keys() | set(cost.RATES.values())
    assert sorted(k for k in written if metrics.lookup(k) is None) == []
    never = [m.name for m in metrics.registered() if not any(m.pattern.fullmatch(k) for k in written)]
    assert never == [], f"registered, but no code writes them: {never}"


def test_the_registry_knows_which_way_each_figure_improves():
    from fxtrack.metrics import lookup

    assert lookup("resident_step_time_ms_p50").lower_is_better  # as step_time_ms_p50
    assert not lookup("resident_samples_per_s").lower_is_better
    assert lookup("checkpoint_restore_exact").direction == "higher"  # 1: exact
    assert lookup("serve_tpot_ms_p99").lower_is_better and lookup("throughput_rel_ci").lower_is_better
    assert lookup("param_count").direction == "neither" and lookup("no_such_metric") is None
    assert lookup("speedup_x16").direction == "higher" and lookup("speedup_xy") is None


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory):
    """Real Results of a tiny torch ViT, 2 steps, in-process: train and inference."""
    pytest.importorskip("torch")
    from conftest import job_spec

    from fxtrack.worker.__main__ import run

    out = {}
    for scenario in ("train", "inference"):
        spec = job_spec("torch", "vit", tmp_path_factory.mktemp(scenario), steps=2,
                        warmup_steps=1, scenario=scenario,
                        runner=f"fxtrack.scenarios.{scenario}.runner:run")
        result = run(spec)
        assert result.status == "FINISHED", result.error
        out[scenario] = (spec, result)
    return out


def test_a_real_runs_metrics_and_series_are_in_the_contract(worker_results):
    from fxtrack import metrics as registry
    from fxtrack.measure import complexity

    metrics = section("Metrics")
    names = first_column_names(metrics)
    for spec, result in worker_results.values():
        assert len(result.metrics) > 10
        keys = set(result.metrics) | set(complexity.code_metrics(spec.framework))
        assert not undocumented(keys, names), f"{spec.scenario}: {undocumented(keys, names)}"
        assert sorted(k for k in keys if registry.lookup(k) is None) == [], spec.scenario
        assert all(spec.scenario in registry.lookup(k).scenarios for k in result.metrics
                   if not k.startswith("code_")), spec.scenario
        for series in result.series:
            assert f"`{series}`" in metrics, f"series {series} is not in the Metrics section"


# --- tags --------------------------------------------------------------------------------------

TAG_NAMES = {"tags", "result.tags"}


def scanned_tags() -> set[str]:
    """``fxtrack.*`` tag names in fxtrack/: literal names, and the worker's short names (which
    the job record prefixes), f-string names expanded."""
    from fxtrack.tracking.records import _DEVICE_TAGS

    runtimes = sorted(p.stem for p in (PACKAGE / "runtimes").glob("*.py")
                      if re.search(r"^def version\(", p.read_text(encoding="utf-8"), re.MULTILINE))
    from fxtrack.metrics import CAVEATS

    families = {"f'{spec.runtime}_version'": [f"{r}_version" for r in runtimes],
                # an aggregate carries each declared caveat of its repeats (repeats.py)
                "f'fxtrack.{caveat.tag}'": [c.tag for c in CAVEATS]}
    full: set[str] = set()
    short: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "report":
            continue  # reads tags
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(
                    r"fxtrack\.[a-z0-9_]+", n.value):
                name = n.value.split(".", 1)[1]
                if not ((PACKAGE / f"{name}.py").exists() or (PACKAGE / name).is_dir()
                        or name == "conf"):  # modules, and the wheel's config package
                    full.add(n.value)
        worker_side = path.relative_to(PACKAGE).parts[0] in (
            "worker", "scenarios", "frameworks", "measure", "orchestrator")
        if not worker_side:
            continue
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            in_tag_builder = fn.name in ("tags", "configure", "device_tags")
            for n in ast.walk(fn):
                nodes: list[ast.AST] = []
                if isinstance(n, ast.Assign):
                    for t in n.targets:
                        if isinstance(t, ast.Subscript) and ast.unparse(t.value) in TAG_NAMES:
                            nodes.append(t.slice)
                elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                      and n.func.attr == "update" and ast.unparse(n.func.value) in TAG_NAMES):
                    nodes += [ast.Constant(k.arg) for k in n.keywords if k.arg]
                elif isinstance(n, ast.Dict) and in_tag_builder:
                    nodes += [k for k in n.keys if k is not None]
                for node in nodes:
                    if isinstance(node, ast.Constant) and isinstance(node.value, str):
                        short.add(node.value)
                    elif isinstance(node, ast.JoinedStr):
                        source = ast.unparse(node)
                        assert source in families, f"{path}: tag {source} is new: expand it"
                        short.update(families[source])
    mapped = {k if k.startswith(("fxtrack.", "mlflow.")) else _DEVICE_TAGS.get(k, f"fxtrack.{k}")
              for k in short}
    return {t for t in full | mapped if t.startswith("fxtrack.")}


def test_every_tag_is_in_the_contract():
    tags = scanned_tags()
    assert len(tags) > 30 and {"fxtrack.framework", "fxtrack.contended", "fxtrack.attention",
                               "fxtrack.jax_donation", "fxtrack.cpu"} <= tags, sorted(tags)
    missing = undocumented(tags, first_column_names(section("Tags")))
    assert not missing, f"tags missing from docs/contract.md's Tags table: {missing}"


def test_a_real_runs_tags_are_in_the_contract(worker_results):
    from fxtrack.tracking import records

    names = first_column_names(section("Tags"))
    for spec, result in worker_results.values():
        record = records.job_record(spec, result, {}, "sqlite:///unused.db", "fxtrack", None, 0)
        tags = {k for k in record["tags"] if k.startswith("fxtrack.")}
        assert {"fxtrack.framework", "fxtrack.compile_mode"} <= tags
        assert not undocumented(tags, names), f"{spec.scenario}: {undocumented(tags, names)}"


# --- configuration keys and commands -----------------------------------------------------------

def schema_keys() -> set[str]:
    """Every key of the config schema: top-level keys, groups, and group.key."""
    from fxtrack.config import schema

    def fields(cls: type) -> dict[str, typing.Any]:
        hints = typing.get_type_hints(cls)
        return {f.name: hints[f.name] for f in dataclasses.fields(cls)}

    keys = set()
    for name, hint in fields(schema.FxtrackConfig).items():
        if name == "model":
            members = list(schema.model_schemas().values())
        elif dataclasses.is_dataclass(hint):
            members = [hint]
        else:
            keys.add(name)
            continue
        if any("name" in fields(cls) for cls in members):
            keys.add(name)  # a config group: its `name` is the chosen option
        keys.update(f"{name}.{k}" for cls in members for k in fields(cls) if k != "name")
    return keys


def test_every_config_key_is_in_the_contract():
    keys = schema_keys()
    assert {"batch_size", "framework.compile", "model.layers", "hardware.cpu_threads",
            "tracking.uri"} <= keys and len(keys) > 30
    missing = undocumented(keys, first_column_names(section("Configuration keys")))
    assert not missing, f"config keys missing from docs/contract.md: {missing}"


def _help(command: str) -> str:
    from fxtrack.cli import SUBCOMMANDS
    from fxtrack.frameworks.declaration import import_path

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        import_path(SUBCOMMANDS[command][0])(["--help"])
    return out.getvalue()


def test_every_sub_command_and_option_is_in_the_contract():
    from fxtrack.cli import SUBCOMMANDS

    text = section("Commands")
    assert SUBCOMMANDS
    for command in SUBCOMMANDS:
        match = re.search(rf"^### fxtrack {command}\n(.*?)(?=^##|\Z)", text,
                          re.MULTILINE | re.DOTALL)
        assert match, f"docs/contract.md's Commands section has no '### fxtrack {command}'"
        options = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", _help(command))) - {"--help"}
        assert options or command == "sync", f"no options found in `fxtrack {command} --help`"
        missing = [o for o in sorted(options) if not re.search(rf"`{o}\b", match.group(1))]
        assert not missing, f"fxtrack {command}: options missing from docs/contract.md: {missing}"
    assert "`fxtrack --version`" in text and "python -m fxtrack -m" in text


# --- the declarations in the contract and the README --------------------------------------------

def _group_options(group: str) -> str:
    """The options cell of the contract's Groups row for ``group``."""
    rows = [cells for cells in table_rows(section("Configuration keys"))
            if cells[0].strip() == f"`{group}`"]
    assert rows, f"docs/contract.md's Groups table has no `{group}` row"
    return rows[0][1]


def _readme_part(start: str, end: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text[text.index(start):text.index(end, text.index(start))]


def _layout_entry(layout: str, path: str) -> str:
    """The README layout's entry for ``path``: its line and the indented lines continuing it."""
    match = re.search(rf"^{re.escape(path)}.*\n(?:^ {{10,}}.*\n)*", layout, re.MULTILINE)
    assert match, f"the README's layout has no {path} entry"
    return match.group(0)


def undocumented_declarations() -> list[str]:
    """What is registered or declared (scenarios, model families and their models, frameworks,
    sub-commands) but missing from the contract's Groups or Commands tables, or from the
    README's intro or layout, as ``kind=name``."""
    from fxtrack import architectures, families, scenarios
    from fxtrack.cli import SUBCOMMANDS
    from fxtrack.config.frameworks import declared

    intro = _readme_part("# fxtrack", "## Run it")
    layout = (ROOT / "README.md").read_text(encoding="utf-8").split("## Layout", 1)[1]
    commands = section("Commands")
    missing = []
    for name in scenarios.names():
        if f"`{name}`" not in _group_options("scenario") or not re.search(
                rf"\b{name}\b", _layout_entry(layout, "fxtrack/scenarios/")):
            missing.append(f"scenario={name}")
    models = _group_options("model")
    for model in [*architectures.models(), *(f for f in families.names()
                                           if families.get(f).user)]:
        if f"`{model}`" not in models:
            missing.append(f"model={model}")
    for family in families.names():
        if not re.search(rf"\b{family}\b", _layout_entry(layout, "fxtrack/families/")):
            missing.append(f"family={family}")
    for name, framework in declared().items():
        if f"`{name}`" not in _group_options("framework") or framework.said not in intro:
            missing.append(f"framework={name}")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for command in SUBCOMMANDS:
        if f"`{command}`" not in commands or f"fxtrack {command}" not in readme:
            missing.append(f"command={command}")
    return missing


def test_every_declaration_is_in_the_contract_and_the_readme():
    assert not undocumented_declarations()


def test_docs_index_links_every_page():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    # docs/results/ has its own index, which this one links
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "index.md")
    assert pages
    missing = [p for p in pages if f"({p})" not in index and f"({p}#" not in index]
    assert not missing, f"docs/index.md does not link: {missing}"


def test_no_stale_sentence_stays():
    stale = {"fxtrack/config/validate.py": "(implemented: scenario=train)",
             "docs/mlflow-ui.md": "predate the UI"}
    for path, text in stale.items():
        assert text not in (ROOT / path).read_text(encoding="utf-8"), (path, text)


# --- the README, dangling references, links -----------------------------------------------------

def test_readme_keeps_the_commands_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.startswith("python3 -m venv")]
    assert len(ci) == 1 and ci[0] in readme.splitlines(), "README's test command != .ci/run's"
    assert ("python3 -m venv .venv && .venv/bin/pip install -e '.[jax]' && .venv/bin/python -m "
            "fxtrack framework=jax model=vit") in readme.splitlines()
    assert len(readme.splitlines()) <= 220, "the README is a front page; details go to docs/"
    for image in (ROOT / "docs").glob("*.png"):
        assert f"(docs/{image.name})" in readme, f"docs/{image.name} is no longer shown"


def test_the_heaviest_first_order_names_test_files_that_exist():
    """tests/conftest.py's FILE_SECONDS orders xdist's files; a renamed file would drop to
    the end of the order unnoticed."""
    from conftest import FILE_SECONDS

    missing = [name for name in FILE_SECONDS if not (ROOT / "tests" / name).exists()]
    assert not missing, missing
    assert list(FILE_SECONDS.values()) == sorted(FILE_SECONDS.values(), reverse=True)


def test_nothing_cites_a_design_document_the_repository_lacks():
    # The contract is docs/contract.md; a wheel user has no design document beside it.
    cited = [f"{p.relative_to(ROOT)}:{i}" for top in ("fxtrack", "conf", "tests")
             for p in sorted((ROOT / top).rglob("*")) if p.suffix in (".py", ".yaml", ".md")
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"DESIGN\.md", line)]
    assert not cited, f"point these at docs/ instead: {cited}"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_in_the_docs_resolve():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", dest.read_text(encoding="utf-8"), re.MULTILINE)
                if anchor not in {_anchor(h) for h in headings}:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


def test_the_system_metrics_are_in_the_contract():
    # The sampler writes series, not metrics, so the scan above does not see its keys: they are
    # read from the module itself.
    from fxtrack.measure import system

    names = first_column_names(section("Metrics"))
    keys = {system.CPU_KEY, system.MEMORY_MB_KEY, system.MEMORY_PCT_KEY,
            *system.gpu_keys(0).values(), *system.gpu_keys(3).values()}
    assert not undocumented(keys, names), undocumented(keys, names)


def test_every_compile_rule_links_the_docs_holding_its_figure_and_carries_none():
    # Figures out of code (issue 29): a rule says why in one line; its figure, interval, machine
    # and command live at its docs anchor, so that re-measuring changes the docs only.
    from fxtrack.config.frameworks import declared

    figure = re.compile(r"\d\s*(x\b|%)|\[\s*\d|\d+(\.\d+)?\s*(s|ms|min)\b|\d\.\d")
    problems = []
    for name, framework in declared().items():
        for rule in framework.compile_rules:
            path, _, anchor = rule.docs.partition("#")
            page = ROOT / path
            headings = (re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.MULTILINE)
                        if path.startswith("docs/") and page.is_file() else [])
            if not anchor or anchor not in {_anchor(h) for h in headings}:
                problems.append(f"{name}: {rule.why!r} links {rule.docs!r}, no such anchor")
            if figure.search(rule.why) or "\n" in rule.why:
                problems.append(f"{name}: {rule.why!r} carries a figure (move it to {rule.docs})")
    assert not problems, problems


def test_the_contracts_parameter_counts_are_the_declared_ones():
    """docs/contract.md's canonical counts are each model's declared ``Model.params`` (the
    correctness guard and the frameworks' tests hold every framework to those), every one."""
    from fxtrack import architectures

    paragraph = CONTRACT.read_text(encoding="utf-8").split(
        "Canonical trainable parameter counts")[1].split("\n\n")[0]
    said = {name: int(count.replace(",", ""))
            for name, count in re.findall(r"`(\w+)` (\d{1,3}(?:,\d{3})+)", paragraph)}
    assert said == {name: architectures.param_count(name) for name in architectures.models()}
