"""docs/architecture.md's module table matches the package exactly."""

from __future__ import annotations

import re
from pathlib import Path

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
    harness = (PACKAGE / "probes" / "harness.py").read_text()
    assert "workloads." not in re.sub(r"workloads\.build", "", harness)
    for module in (PACKAGE / "probes" / "workloads").glob("*.py"):
        assert "probes.harness" not in module.read_text(), module.name
