"""The XID catalog rows: every listed code resolves to a known bucket, and the rows an
operator meets most often say what NVIDIA's catalog says (Immediate Action column)."""

from __future__ import annotations

import pytest

from gpuperfd.health import xid_catalog as xc


def test_every_listed_code_has_a_bucket_we_map() -> None:
    for code, entry in xc.CATALOG.items():
        assert entry.code == code and entry.name
        assert entry.bucket in xc.BUCKETS or entry.bucket in xc.WORKFLOWS, (code, entry.bucket)
        assert xc.resolve(code)[2] != "UNKNOWN", code


@pytest.mark.parametrize("code, bucket, severity, action", [
    (13, "RESTART_APP", "info", "restart_app"),
    (31, "RESTART_APP", "info", "restart_app"),
    (43, "IGNORE", "info", "none"),
    (54, "CHECK_MECHANICALS", "unhealthy", "check_hardware"),
    (63, "IGNORE", "info", "none"),
    (64, "RESET_GPU", "unhealthy", "reset_gpu"),
    (78, "UPDATE_SWFW", "degraded", "update_software"),
    (79, "RESTART_BM", "unhealthy", "reboot_node"),
    (94, "RESTART_APP", "info", "restart_app"),
    (95, "RESET_GPU", "unhealthy", "reset_gpu"),
    (119, "RESET_GPU", "unhealthy", "reset_gpu"),
    (151, "RESTART_VM", "unhealthy", "reboot_node"),
    (160, "RESTART_BM", "unhealthy", "reboot_node"),
])
def test_rows_follow_nvidias_immediate_action(code: int, bucket: str, severity: str, action: str) -> None:
    assert xc.CATALOG[code].bucket == bucket
    assert xc.resolve(code) == (severity, action, bucket)


@pytest.mark.parametrize("code", [1, 2, 7, 9, 12, 15, 30, 171, 999])
def test_unused_and_unlisted_codes_are_unknown_never_healthy(code: int) -> None:
    assert code not in xc.CATALOG
    assert xc.resolve(code) == ("unknown", "contact_support", "UNKNOWN")


def test_provenance_names_the_sources() -> None:
    assert xc.CATALOG_URL in xc.__doc__ and "NVSentinel" in xc.CATALOG_PROVENANCE
    assert xc.CATALOG_MIRROR_COMMIT[:12] in xc.CATALOG_PROVENANCE
