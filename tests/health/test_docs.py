"""docs/health.md is generated from the check table and the XID catalog: the committed file
must equal the generated one, and it must name every check, threshold key and catalog code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpuperfd.health import checks, docs, xid_catalog

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "health.md"


def test_committed_page_equals_the_generated_one() -> None:
    assert DOC.read_text() == docs.render(), f"docs/health.md is stale: run `{docs.REGENERATE}`"


def test_the_regeneration_command_writes_the_page() -> None:
    out = subprocess.run([sys.executable, "-m", "gpuperfd.health.docs"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60, check=True)
    assert out.stdout == DOC.read_text()


def test_page_names_every_check_key_and_code() -> None:
    page = docs.render()
    for check in checks.CHECKS:
        assert f"| `{check.id}` |" in page
    for key in checks.defaults():
        assert f"`{key}`" in page, key
    for code, entry in xid_catalog.CATALOG.items():
        assert f"| {code} | {entry.name} | {entry.bucket} |" in page
    assert xid_catalog.CATALOG_URL in page and xid_catalog.CATALOG_MIRROR_COMMIT[:12] in page
    assert '"schema": "gpuperfd.health/1"' in page


def test_docs_configuration_has_the_health_section() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert "\nhealth:" in text and "### health" in text
    assert "interval_seconds: 5.0" in text
