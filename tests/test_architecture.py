"""The architecture's rules as tests: docs/architecture.md's module table matches the package exactly,
every import direction "The tree" states holds (function-level imports included), the figures it states
match the code, and functions stay short."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpuperfd"


def _table_entries() -> list[str]:
    """Every module path the table names, relative to gpuperfd/ (globs kept as globs)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## Modules"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    entries: list[str] = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cell = line.split("|")[1]
        folder = ""
        for name in re.findall(r"`([^`]+)`", cell):
            if "/" in name:
                folder = name.rsplit("/", 1)[0] + "/"
                entries.append(name)
            else:  # a sibling of the previous name in the same cell, or a top-level module
                entries.append(folder + name)
    return entries


def _package_modules() -> set[str]:
    return {
        str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py") or path.parent.name in ("workloads", "config")
    }


def test_every_module_in_the_table_exists() -> None:
    missing = [entry for entry in _table_entries() if not list(PACKAGE.glob(entry))]
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_module_is_in_the_table() -> None:
    named = {str(p.relative_to(PACKAGE)) for entry in _table_entries() for p in PACKAGE.glob(entry)}
    unnamed = sorted(_package_modules() - named)
    assert not unnamed, f"modules missing from docs/architecture.md's table: {unnamed}"


def test_top_level_holds_only_entry_points() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert top == ["cli.py", "console.py", "daemon.py"], top



# --- layout by stage (issue 54) ---------------------------------------------------------------------

#: The most modules probing/ may hold at its top: the rest belongs in its stages' folders.
MAX_PROBING_TOP = 15
#: Test folders that test something of the repository outside the package (tests/deploy/: deploy/).
OUTSIDE_PACKAGE = ("deploy",)


def _prefix_families(root: Path) -> list[str]:
    """Every folder under ``root`` holding three or more modules of one prefix (the part of the name before
    the first underscore; a module named the prefix alone counts too): a family of names wants a folder."""
    found = []
    for folder in sorted({root, *(p for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__")}):
        families: dict[str, list[str]] = {}
        for module in folder.glob("*.py"):
            if not module.stem.startswith("__"):
                families.setdefault(module.stem.split("_")[0], []).append(module.stem)
        found += [f"{folder.relative_to(root.parent)}/: {sorted(names)}"
                  for prefix, names in sorted(families.items()) if len(names) >= 3]
    return found


def _top_modules(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.py") if p.name != "__init__.py")


def _unmirrored_tests(tests: Path, package: Path, outside: tuple[str, ...] = OUTSIDE_PACKAGE) -> list[str]:
    """Every test module in a folder that is not a folder of the package (tests/X/Y/ for gpuperfd/X/Y/)."""
    bad = []
    for test in sorted(tests.rglob("test_*.py")):
        folder = test.parent.relative_to(tests)
        if folder.parts and not (package / folder).is_dir() and folder.parts[0] not in outside:
            bad.append(str(test.relative_to(tests.parent)))
    return bad


def test_no_folder_holds_three_modules_of_one_prefix() -> None:
    families = _prefix_families(PACKAGE)
    assert not families, "a family of names wants a folder of its own:\n" + "\n".join(families)


def test_probing_keeps_at_most_15_modules_at_its_top() -> None:
    top = _top_modules(PACKAGE / "probing")
    assert len(top) <= MAX_PROBING_TOP, f"probing/ holds {len(top)} modules at its top: {top}"


def test_tests_mirror_the_package() -> None:
    bad = _unmirrored_tests(ROOT / "tests", PACKAGE)
    assert not bad, "tests in a folder the package does not have:\n" + "\n".join(bad)


def test_the_layout_checks_see_violations(tmp_path: Path) -> None:
    """The three checks themselves, on a tree that breaks each: probing/'s flat layout before issue 54."""
    package, tests = tmp_path / "gpuperfd", tmp_path / "tests"
    (package / "probing" / "sweep").mkdir(parents=True)
    (tests / "probing" / "check").mkdir(parents=True)
    (tests / "deploy").mkdir()
    for name in ("__init__", "check", "check_cli", "check_interconnect", "checkpoint", "simulated_probe",
                 "simulated_workload", *(f"m{i}" for i in range(10))):
        (package / "probing" / f"{name}.py").write_text("")
    for name in ("sweep_a", "sweep_b", "caps"):
        (package / "probing" / "sweep" / f"{name}.py").write_text("")
    for test in ("probing/check/test_check.py", "probing/test_sweep.py", "deploy/test_rules.py", "test_cli.py"):
        (tests / test).write_text("")
    # checkpoint is not of the check family (its prefix is checkpoint); two simulated_* are not three
    assert _prefix_families(package) == ["gpuperfd/probing/: ['check', 'check_cli', 'check_interconnect']"]
    assert len(_top_modules(package / "probing")) == 16 > MAX_PROBING_TOP
    assert _unmirrored_tests(tests, package) == ["tests/probing/check/test_check.py"]
    (package / "probing" / "sweep" / "sweep_c.py").write_text("")
    (package / "probing" / "check").mkdir()
    assert _prefix_families(package)[1] == "gpuperfd/probing/sweep/: ['sweep_a', 'sweep_b', 'sweep_c']"
    assert _unmirrored_tests(tests, package) == []

# --- import direction -----------------------------------------------------------------------------


def _imports(path: Path, package: str | None = None) -> list[tuple[int, str, str | None]]:
    """(line, imported gpuperfd module, enclosing function or None) for every import in ``path``,
    relative imports resolved against ``package`` (by default the one ``path`` is in), function-level
    imports included (they count as much as top-level ones)."""
    tree = ast.parse(path.read_text(), str(path))
    if package is None:
        package = ".".join(("gpuperfd", *path.relative_to(PACKAGE).with_suffix("").parts))
        if path.name != "__init__.py":
            package = package.rsplit(".", 1)[0]
    found: list[tuple[int, str, str | None]] = []

    def visit(node: ast.AST, func: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Import):
                found.extend((child.lineno, a.name, func) for a in child.names if a.name.startswith("gpuperfd"))
            elif isinstance(child, ast.ImportFrom):
                module = child.module or ""
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    module = ".".join([*base, module] if module else base)
                if module.startswith("gpuperfd"):
                    # `from gpuperfd.x import y` may name a module y: count both
                    found.append((child.lineno, module, func))
                    found.extend((child.lineno, f"{module}.{a.name}", func) for a in child.names)
            visit(child, name)

    visit(tree, None)
    return found


def _modules_under(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


def _outside(imports: list[tuple[int, str, str | None]], allowed: tuple[str, ...]) -> list[tuple[int, str]]:
    return [(line, module) for line, module, _ in imports
            if not any(module == a or module.startswith(a + ".") for a in allowed) and module != "gpuperfd"]


def _violations(folder: str, allowed: tuple[str, ...]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line} imports {module}"
            for path in _modules_under(folder) for line, module in _outside(_imports(path), allowed)]


def _package_of(path: Path) -> str:
    """The top-level part of gpuperfd a file belongs to: ``probing`` for probing/sweep/caps.py, ``cli`` for cli.py."""
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _package_imports(folder: str) -> set[str]:
    """The other top-level parts of gpuperfd that any module under ``folder`` imports."""
    return {module.split(".")[1] for path in _modules_under(folder) for _, module, _ in _imports(path)
            if module.count(".") >= 1 and module.split(".")[1] != folder}


# docs/architecture.md, "The tree": each rule below is a sentence there; the comment quotes its gist.
@pytest.mark.parametrize(
    ("folder", "allowed"),
    [
        # the child: its own package, the shared data, the device layer (it reads the energy counter) and
        # the host's memory figures (a Llama point on a CPU checks its room first); never probing,
        # telemetry, web or config
        ("probe_child", ("gpuperfd.probe_child", "gpuperfd.probe_data", "gpuperfd.device",
                         "gpuperfd.system.cgroup_memory")),
        # the shared data imports neither side, nor the device layer: plain data and pure rules
        ("probe_data", ("gpuperfd.probe_data",)),
        # nothing below device/ imports above it; the configuration is a leaf of plain data it reads
        ("device", ("gpuperfd.device", "gpuperfd.config")),
        # the configuration is a leaf: the names other packages own are handed in (gpuperfd.cli)
        ("config", ("gpuperfd.config",)),
        # telemetry imports device, attribution (who holds a GPU) and the config (each collector reads its
        # own section, as node_exporter's own their flags) only: never the probing flow or web
        ("telemetry", ("gpuperfd.telemetry", "gpuperfd.device", "gpuperfd.attribution", "gpuperfd.config")),
        # web serves what telemetry renders, the health verdict and the shared probe data; never probing
        ("web", ("gpuperfd.web", "gpuperfd.telemetry", "gpuperfd.health", "gpuperfd.probe_data", "gpuperfd.config")),
        # top reads the daemon over HTTP (web's shape) or the device through the collectors; nothing of
        # the probing flow (the --gpus parser and the console helpers are its command's, commands/top.py)
        ("top", ("gpuperfd.top", "gpuperfd.web", "gpuperfd.telemetry", "gpuperfd.device", "gpuperfd.config")),
        # the report reads run records and imports the recommendation rule, never the sweeper (offline)
        ("report", ("gpuperfd.report", "gpuperfd.probe_data")),
        # apply acts on the probing flow's results and the verdict through caps/ (journal, locks, holds);
        # nothing of the probing flow or telemetry imports it (the daemon wires it in)
        ("apply", ("gpuperfd.apply", "gpuperfd.caps", "gpuperfd.probing", "gpuperfd.probe_data",
                   "gpuperfd.device", "gpuperfd.health", "gpuperfd.config", "gpuperfd.system")),
        # cap state lies below probing and apply (issue 62): the device, the state files, the config
        ("caps", ("gpuperfd.caps", "gpuperfd.device", "gpuperfd.system", "gpuperfd.config")),
    ],
)
def test_imports_go_one_way(folder: str, allowed: tuple[str, ...]) -> None:
    bad = _violations(folder, allowed)
    assert not bad, f"{folder}/ may import only {allowed}:\n" + "\n".join(bad)


#: What cap state (caps/) never imports: the packages above it (issue 62).
ABOVE_CAPS = ("probing", "apply", "daemon", "cli", "web", "telemetry")


def _imports_of_packages(folder: str, packages: tuple[str, ...]) -> list[str]:
    """Every import of one of ``packages`` (top-level parts of gpuperfd) by a module under ``folder``."""
    return [f"{path.relative_to(ROOT)}:{line} ({func}) imports {module}"
            for path in _modules_under(folder) for line, module, func in _imports(path)
            if module.count(".") >= 1 and module.split(".")[1] in packages]


def test_caps_imports_nothing_above_it() -> None:
    """caps/ records, compares and restores a cap's owner for probing and apply; it imports neither of
    them, nor the entry points, web or telemetry (function-level imports included)."""
    assert (PACKAGE / "caps").is_dir() and _modules_under("caps")
    bad = _imports_of_packages("caps", ABOVE_CAPS)
    assert not bad, "caps/ imports a package above it:\n" + "\n".join(bad)


def test_probing_never_imports_apply() -> None:
    """The old upward arrow (issue 62): `restore-caps` reached up into apply/ for its restore, from a function."""
    bad = _imports_of_packages("probing", ("apply",))
    assert not bad, "probing/ imports apply/:\n" + "\n".join(bad)


def test_top_takes_nothing_from_probing() -> None:
    """top/ reads the daemon over HTTP: it imports nothing of the probing flow (its command takes the --gpus
    parser from commands/check.py, command to command)."""
    used = {module for path in _modules_under("top") for _, module, _ in _imports(path)
            if module.startswith("gpuperfd.probing")}
    assert not used, used


def test_nothing_outside_the_child_package_imports_it() -> None:
    """The parent starts the child by module name (``python -m``); no module outside probe_child/ imports it,
    the daemon included."""
    bad = []
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(PACKAGE / "probe_child"):
            continue
        for line, module, func in _imports(path):
            if module.startswith("gpuperfd.probe_child"):
                bad.append(f"{path.relative_to(ROOT)}:{line} ({func}) imports {module}")
    assert not bad, "nothing outside probe_child/ may import the child package:\n" + "\n".join(bad)


#: Where the commands may be imported from: the entry point registers them, and they import each other.
COMMAND_IMPORTERS = ("commands", "cli")


def _command_importers(package: Path) -> list[str]:
    """Every import of gpuperfd.commands by a module of ``package`` outside commands/ and cli.py."""
    bad = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if (rel.parts[0] if len(rel.parts) > 1 else rel.stem) in COMMAND_IMPORTERS:
            continue
        bad += [f"{path.relative_to(package.parent)}:{line} ({func}) imports {module}"
                for line, module, func in _imports(path, ".".join((package.name, *rel.parent.parts)))
                if module == "gpuperfd.commands" or module.startswith("gpuperfd.commands.")]
    return bad


def test_nothing_outside_the_commands_imports_them() -> None:
    """Issue 62: the commands call down into the library, never the other way; a library module that needs
    something of a command's module means that something belongs in the library (function-level imports
    included)."""
    assert (PACKAGE / "commands").is_dir() and _modules_under("commands")
    bad = _command_importers(PACKAGE)
    assert not bad, "only commands/ and cli.py may import gpuperfd.commands:\n" + "\n".join(bad)


def test_the_commands_check_sees_violations(tmp_path: Path) -> None:
    """The checker itself: a library module's function-level import and relative import of a command are
    seen; cli.py's and one command's import of another are not."""
    package = tmp_path / "gpuperfd"
    for folder in ("commands", "probing", "top"):
        (package / folder).mkdir(parents=True)
    (package / "cli.py").write_text("from gpuperfd.commands import probe\n")
    (package / "commands" / "top.py").write_text("from gpuperfd.commands.check import gpu_list\n")
    (package / "probing" / "matrix.py").write_text("def f():\n    from gpuperfd.commands import probe\n")
    (package / "top" / "local.py").write_text("from ..commands.check import gpu_list\n")
    assert _command_importers(package) == [
        "gpuperfd/probing/matrix.py:2 (f) imports gpuperfd.commands",
        "gpuperfd/probing/matrix.py:2 (f) imports gpuperfd.commands.probe",
        "gpuperfd/top/local.py:1 (None) imports gpuperfd.commands.check",
        "gpuperfd/top/local.py:1 (None) imports gpuperfd.commands.check.gpu_list",
    ]


def test_the_parent_names_the_child_module_only() -> None:
    from gpuperfd.probing.child.runner import CHILD_MODULE

    assert CHILD_MODULE == "gpuperfd.probe_child.child"
    assert (PACKAGE / "probe_child" / "child.py").is_file()


def test_nothing_imports_the_entry_points() -> None:
    """cli.py, daemon.py and __main__.py wire the packages; no package imports them back (cli imports daemon)."""
    entry = {"cli", "daemon", "__main__"}
    bad = [f"{path.relative_to(ROOT)}:{line} imports {module}"
           for path in PACKAGE.rglob("*.py") if _package_of(path) not in entry
           for line, module, _ in _imports(path) if module.count(".") >= 1 and module.split(".")[1] in entry]
    assert not bad, "\n".join(bad)


#: The two flows of "The tree" (docs/architecture.md) by package.
FLOWS = {"telemetry": ("telemetry", "web"), "probing": ("probing", "probe_child", "probe_data")}
#: The modules of one flow that import the other; the tree's paragraph names each, and only these.
MEETING_PLACES = {
    "probing/gates/idle.py",  # the busy check reads the sampler's Readings
    "probing/check/flow.py",  # `gpuperfd check` reads each GPU once through the collectors and a Sampler
    "web/landing.py",  # the landing page shows probe results and the recommendation (probe_data)
    "web/status.py",  # /api/v1/gpus (gpuperfd top): the same, and a sweep in progress (probe_data)
}


def _flow_meetings() -> set[str]:
    flow_of = {package: flow for flow, packages in FLOWS.items() for package in packages}
    meet = set()
    for path in PACKAGE.rglob("*.py"):
        flow = flow_of.get(_package_of(path))
        for _, module, _ in _imports(path):
            other = flow_of.get(module.split(".")[1]) if module.count(".") >= 1 else None
            if flow and other and other != flow:
                meet.add(str(path.relative_to(PACKAGE)))
    return meet


def test_the_two_flows_meet_only_where_the_tree_says() -> None:
    assert _flow_meetings() == MEETING_PLACES
    text = (ROOT / "docs" / "architecture.md").read_text()
    tree = text[text.index("## The tree"):text.index("## Modules")]
    paragraph = tree[:tree.index("```")]
    for place in MEETING_PLACES:
        assert f"`{place}`" in paragraph, f"docs/architecture.md's tree paragraph does not name {place}"


def test_the_probing_flow_meets_telemetry_only_through_the_sampler() -> None:
    """telemetry never imports the probing flow; probing imports telemetry only in its meeting places."""
    assert not _package_imports("telemetry") & set(FLOWS["probing"])
    users = {str(path.relative_to(PACKAGE)) for path in _modules_under("probing")
             for _, module, _ in _imports(path) if module.startswith("gpuperfd.telemetry")}
    assert users <= MEETING_PLACES, users


def test_harness_and_workloads_do_not_import_each_other() -> None:
    """The harness picks a workload by name through the registry (workloads/__init__.py) only."""
    harness = {m for _, m, _ in _imports(PACKAGE / "probe_child" / "harness.py")}
    assert not {m for m in harness if m.startswith("gpuperfd.probe_child.workloads.")}, harness
    for module in (PACKAGE / "probe_child" / "workloads").glob("*.py"):
        assert not [m for _, m, _ in _imports(module) if m.startswith("gpuperfd.probe_child.harness")], module.name


def test_the_import_check_sees_violations(tmp_path: Path) -> None:
    """The checker itself: a function-level import and a relative import are both seen."""
    module = tmp_path / "example.py"
    module.write_text("def f():\n    from gpuperfd.probing import observer\n\nfrom ..telemetry import sampler\n")
    bad = _outside(_imports(module, "gpuperfd.probe_data"), ("gpuperfd.probe_data",))
    assert [m for _, m in bad] == ["gpuperfd.probing", "gpuperfd.probing.observer",
                                   "gpuperfd.telemetry", "gpuperfd.telemetry.sampler"], bad


# --- figures the document states ---------------------------------------------------------------


def test_the_stated_slow_lane_intervals_are_the_collectors_defaults() -> None:
    """Every "energy ... N s" and "PCIe ... N s" in docs/architecture.md is the collector's default interval."""
    from gpuperfd.telemetry.collectors import COLLECTORS

    text = (ROOT / "docs" / "architecture.md").read_text()
    for name, pattern in (("energy", r"energy(?: counter)?(?: every)? (\d+(?:\.\d+)?) s\b"),
                          ("pcie", r"PCIe(?: every)? (\d+(?:\.\d+)?) s\b")):
        stated = {float(n) for n in re.findall(pattern, text)}
        assert stated == {COLLECTORS[name].default_interval_seconds}, (name, stated)


# --- function length -----------------------------------------------------------------------------

#: The longest a function (body, decorators and docstring included) may be.
MAX_FUNCTION_LINES = 80
#: Generated code is exempt (none in the package today).
GENERATED: frozenset[str] = frozenset()
def _function_lengths(path: Path) -> dict[str, tuple[int, int]]:
    """'path Class.function' -> (line, length) for every function in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    out: dict[str, tuple[int, int]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                name = prefix + child.name
                out[f"{path.relative_to(ROOT)} {name}"] = (child.lineno, (child.end_lineno or child.lineno) - start + 1)
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _all_function_lengths() -> dict[str, tuple[int, int]]:
    return {name: found for path in sorted(PACKAGE.rglob("*.py"))
            if str(path.relative_to(PACKAGE)) not in GENERATED for name, found in _function_lengths(path).items()}


def _long_functions(lengths: dict[str, tuple[int, int]]) -> list[str]:
    """The functions over the limit (every one was split when it came down from 100, issue 42)."""
    return [f"{name} (line {line}) is {length} lines (at most {MAX_FUNCTION_LINES})"
            for name, (line, length) in lengths.items() if length > MAX_FUNCTION_LINES]


def test_no_function_is_longer_than_80_lines() -> None:
    long = _long_functions(_all_function_lengths())
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_the_length_check_sees_a_long_function() -> None:
    lengths = _all_function_lengths()
    assert not _long_functions(lengths)
    assert _long_functions({**lengths, "gpuperfd/x.py new": (1, 81)}) == [
        f"gpuperfd/x.py new (line 1) is 81 lines (at most {MAX_FUNCTION_LINES})"]
    assert not _long_functions({**lengths, "gpuperfd/x.py fits": (1, 80)})



def _import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere (top level, functions, TYPE_CHECKING)."""
    modules = {".".join(p.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in package.rglob("*.py")}

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            deps |= {o for t in targets if t.startswith(package.name) and (o := owner(t))}
        graph[name] = {d for d in deps if d != name and not name.startswith(d + ".")}  # a package's __init__
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other round a circle (strongly connected, two or more)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles() -> None:
    """Issue 54: no two modules of the package import each other, directly or round a circle, counting
    every import (a lazy or TYPE_CHECKING one is still a knot: simulated <-> simulated_topology was one)."""
    assert _circles(_import_graph(PACKAGE)) == []


def test_the_circle_check_sees_a_circle(tmp_path: Path) -> None:
    package = tmp_path / "gpuperfd"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("from gpuperfd.sub.b import x\n")
    (package / "sub" / "b.py").write_text("def f():\n    from gpuperfd.sub import a\n")
    assert _circles(_import_graph(package)) == [["gpuperfd.sub.a", "gpuperfd.sub.b"]]


# --- one owner of GPU turns (issue 62) -------------------------------------------------------------

#: Where modules use each other's objects through declared names only: no getattr/hasattr with a literal
#: name on a service or turns object (a typed object is asked directly), no other object's private
#: attribute (``x._name`` with x not self or cls).
DECLARED_NAMES_ONLY = ("probing/scheduling", "probing/interconnect", "probing/gates", "commands")


def _reaching_in(path: Path) -> list[str]:
    """Every getattr/hasattr by literal name on a ``service``/``turns`` object, and every private attribute
    of an object other than self or cls, in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and re.search(r"service|turns", ast.unparse(node.args[0]))):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
        elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
              and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("folder", DECLARED_NAMES_ONLY)
def test_no_module_reaches_into_a_service_by_name(folder: str) -> None:
    bad = [hit for path in _modules_under(folder) for hit in _reaching_in(path)]
    assert not bad, f"{folder}/ reaches into objects by name:\n" + "\n".join(bad)


def test_the_reaching_in_check_sees_violations(tmp_path: Path) -> None:
    """The checker itself: the scheduler's old getattr/hasattr on the service and its ``_info`` are seen;
    its own privates, a getattr on parsed flags and a dunder are not."""
    module = tmp_path / "scheduler.py"
    module.write_text(
        "class S:\n"
        "    def f(self, service, args):\n"
        "        tracker = getattr(self.service, 'tracker', None)\n"
        "        if hasattr(service, 'devices'):\n"
        "            return self.service._info(0), service.turns._slots\n"
        "        return self._own, cls._other, getattr(args, 'config', None), args.__class__\n")
    assert sorted(_reaching_in(module)) == [
        "scheduler.py:3 getattr(self.service, 'tracker', None)",
        "scheduler.py:4 hasattr(service, 'devices')",
        "scheduler.py:5 self.service._info",
        "scheduler.py:5 service.turns._slots",
    ]


def test_the_documented_walk_is_the_measured_one() -> None:
    """docs/architecture.md's walk of a GPU through a probe round is the traced one
    (benchmarks/structure.py's walk): the modules in the order the round first enters them."""
    import importlib.util
    import re

    spec = importlib.util.spec_from_file_location("structure_benchmark", ROOT / "benchmarks" / "structure.py")
    assert spec is not None and spec.loader is not None
    structure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(structure)
    walk = structure._walk(ROOT)
    assert walk["result"] == "ok", walk
    first_visits = list(dict.fromkeys(name.removeprefix("gpuperfd.") for name in walk["path"]))
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("<!-- walk:start -->", 1)[1].split("<!-- walk:end -->", 1)[0]
    documented = re.findall(r"^\| \d+ \| `([\w.]+)` \|", block, flags=re.M)
    assert documented == first_visits
    assert f"{walk['rooms']} modules, {walk['stays']} stays, {walk['returns']} returns" in text
