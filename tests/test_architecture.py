"""The architecture's rules as tests: docs/architecture.md's module table matches the package exactly,
imports go one way across the probe boundary and down to the device layer, and functions stay short."""

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


def test_harness_and_workloads_do_not_import_each_other() -> None:
    harness = (PACKAGE / "probe_child" / "harness.py").read_text()
    assert "workloads." not in re.sub(r"workloads\.build", "", harness)
    for module in (PACKAGE / "probe_child" / "workloads").glob("*.py"):
        assert "probe_child.harness" not in module.read_text(), module.name


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
            if ".".join(module.split(".")[:2]) not in allowed and module != "gpuperfd"]


def _violations(folder: str, allowed: tuple[str, ...]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line} imports {module}"
            for path in _modules_under(folder) for line, module in _outside(_imports(path), allowed)]


@pytest.mark.parametrize(
    ("folder", "allowed"),
    [
        # the child: its own package, the shared data, the device layer (it reads the energy counter)
        ("probe_child", ("gpuperfd.probe_child", "gpuperfd.probe_data", "gpuperfd.device")),
        # the shared data imports neither side, nor the device layer: plain data and pure rules
        ("probe_data", ("gpuperfd.probe_data",)),
        # nothing below device/ imports above it; the configuration is a leaf of plain data it reads
        ("device", ("gpuperfd.device", "gpuperfd.config")),
        # the configuration is a leaf: the names other packages own are handed in (gpuperfd.cli)
        ("config", ("gpuperfd.config",)),
    ],
)
def test_imports_go_one_way(folder: str, allowed: tuple[str, ...]) -> None:
    bad = _violations(folder, allowed)
    assert not bad, f"{folder}/ may import only {allowed}:\n" + "\n".join(bad)


def test_nothing_outside_the_child_package_imports_it() -> None:
    """The parent starts the child by module name (``python -m``); no module outside probe_child/ imports it."""
    bad = []
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(PACKAGE / "probe_child"):
            continue
        for line, module, func in _imports(path):
            if module.startswith("gpuperfd.probe_child"):
                bad.append(f"{path.relative_to(ROOT)}:{line} ({func}) imports {module}")
    assert not bad, "nothing outside probe_child/ may import the child package:\n" + "\n".join(bad)


def test_the_import_check_sees_violations(tmp_path: Path) -> None:
    """The checker itself: a function-level import and a relative import are both seen."""
    module = tmp_path / "example.py"
    module.write_text("def f():\n    from gpuperfd.probing import runner\n\nfrom ..telemetry import sampler\n")
    bad = _outside(_imports(module, "gpuperfd.probe_data"), ("gpuperfd.probe_data",))
    assert [m for _, m in bad] == ["gpuperfd.probing", "gpuperfd.probing.runner",
                                   "gpuperfd.telemetry", "gpuperfd.telemetry.sampler"], bad


# --- function length -----------------------------------------------------------------------------

#: The longest a function (body, decorators and docstring included) may be.
MAX_FUNCTION_LINES = 100
#: Generated code is exempt (none in the package today).
GENERATED: frozenset[str] = frozenset()


def _long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - start + 1
            if length > MAX_FUNCTION_LINES:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} is {length} lines")
    return out


def test_no_function_is_longer_than_100_lines() -> None:
    long = [f for path in sorted(PACKAGE.rglob("*.py"))
            if str(path.relative_to(PACKAGE)) not in GENERATED for f in _long_functions(path)]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)
