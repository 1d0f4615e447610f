"""The landing page's health column: state, action, reasons (worst first), all escaped."""

from __future__ import annotations

from gpuperfd.health.verdict import Reason, Verdict
from gpuperfd.web.landing import MAX_REASONS_SHOWN, landing_page
from landing_fakes import FakeSampler, row


def reason(check: str, severity: str, action: str, message: str, **evidence: object) -> Reason:
    return Reason(check, severity, action, message, since=1e9, evidence=dict(evidence))


def health_cell(page: str, gpu: int) -> str:
    return row(page, gpu).split('<td class="health', 1)[1]


def test_health_column_shows_state_action_and_reasons_escaped() -> None:
    evil = '<img src=x onerror="alert(1)">'
    verdicts = [
        Verdict(0, "GPU-0"),
        Verdict(1, "GPU-1", [reason("xid", "info", "restart_app", f"XID 31 {evil}", xid=31),
                             reason("ecc_uncorrectable_volatile", "unhealthy", "reset_gpu",
                                    "2 uncorrectable ECC error(s)", value=2.0, note=evil)]),
        Verdict(None, "GPU-gone", [reason("gpu_missing", "unhealthy", "reboot_node", "missing now")]),
    ]
    page = landing_page(FakeSampler(2), "simulated", "/metrics", verdicts=verdicts).decode()
    assert "<th>Health</th>" in page and 'href="/api/v1/health"' in page
    assert "<img" not in page and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page

    healthy = health_cell(page, 0)
    assert 'data-state="healthy" data-action="none"' in healthy and "<li" not in healthy

    faulted = health_cell(page, 1)
    assert 'data-state="unhealthy" data-action="reset_gpu"' in faulted and "reset gpu" in faulted
    # worst reason first; the check and its evidence in the title
    assert faulted.index("ECC") < faulted.index("XID 31")
    assert 'title="ecc_uncorrectable_volatile (unhealthy, reset_gpu): note=&lt;img' in faulted
    assert "value=2.0" in faulted

    missing = page.split('class="gpu-row missing"', 1)[1].split("</tr>", 1)[0]
    assert "GPU-gone" in missing and 'data-action="reboot_node"' in missing and "missing now" in missing


def test_health_column_caps_the_list_and_says_so_without_health() -> None:
    many = [reason(f"check_{i}", "degraded", "check_hardware", f"reason {i}") for i in range(MAX_REASONS_SHOWN + 2)]
    page = landing_page(FakeSampler(1), "simulated", "/metrics", verdicts=[Verdict(0, "GPU-0", many)]).decode()
    cell = health_cell(page, 0)
    assert cell.count("<li title=") == MAX_REASONS_SHOWN and "and 2 more" in cell

    off = landing_page(FakeSampler(1), "simulated", "/metrics").decode()
    assert '<td class="health muted">-</td>' in off
