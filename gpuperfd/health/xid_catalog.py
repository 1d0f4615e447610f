"""NVIDIA's XID catalog as plain data: code -> name and immediate-action bucket.

Source: NVIDIA, "XID Catalog" (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html),
column "Resolution Bucket (Immediate Action)", Ampere-and-newer rows. The page itself could not
be fetched from where this table was written; the entries below were transcribed on
CATALOG_CHECKED from a public triage reference that quotes that catalog row by row (code,
description, immediate action) and checked against gpud's bucket mapping. CATALOG_DATE is the
date of that transcription, not a revision date printed by NVIDIA: re-check the rows against
the live page when updating (docs/health.md says how).

Buckets map to our actions in BUCKETS. Workflow buckets (48, 74, 45, 144-150) get a rule
(``WorkflowRule``): a solo bucket and, when a companion XID was seen in the same window, another.
A code the table does not list, or an entry without a bucket, is handled as UNKNOWN_BUCKET
(docs/health.md "Unknown XID codes"): verdict ``unknown``, never a silent ``healthy``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
CATALOG_CHECKED = "2026-11-25"
CATALOG_DATE = CATALOG_CHECKED

#: Immediate-action bucket -> (severity, action). IGNORE and RESTART_APP leave the GPU fit
#: for work (severity info): the application, not the GPU, needs the action.
BUCKETS: Mapping[str, tuple[str, str]] = {
    "IGNORE": ("info", "none"),
    "RESTART_APP": ("info", "restart_app"),
    "UPDATE_SWFW": ("degraded", "update_software"),
    "RESET_GPU": ("unhealthy", "reset_gpu"),
    "RESTART_VM": ("unhealthy", "reboot_node"),
    "RESTART_BM": ("unhealthy", "reboot_node"),
    "CHECK_MECHANICALS": ("unhealthy", "check_hardware"),
    "CONTACT_SUPPORT": ("unhealthy", "contact_support"),
}

#: What a code missing from the catalog (or an entry without a bucket) gets.
UNKNOWN_BUCKET: tuple[str, str] = ("unknown", "contact_support")


@dataclass(frozen=True)
class WorkflowRule:
    """Our rule for a catalog bucket that names a workflow instead of an action.

    ``companions``: codes whose presence (in the same quiet window on the same GPU)
    selects ``with_companion``; None means "any other XID". Otherwise ``solo`` applies.
    """

    solo: str
    with_companion: str
    companions: frozenset[int] | None
    why: str


WORKFLOWS: Mapping[str, WorkflowRule] = {
    "WORKFLOW_XID_48": WorkflowRule(
        "RESET_GPU", "RESET_GPU", frozenset({63, 64}),
        "uncorrectable (double-bit) ECC error: the catalog resets the GPU when solo and drains then resets "
        "when 63/64 follow; both mean no new work and a GPU reset (a remap failure, 64, is caught by the "
        "row-remapping checks).",
    ),
    "WORKFLOW_NVLINK_ERR": WorkflowRule(
        "RESET_GPU", "RESET_GPU", None,
        "NVLink error: the workflow resets the GPU (or reboots the node if the link stays down, which the "
        "nvlink_link_down check then reports).",
    ),
    "WORKFLOW_XID_45": WorkflowRule(
        "RESTART_APP", "IGNORE", None,
        "preemptive cleanup after an earlier error: with another XID it follows that XID (ignored itself); "
        "solo the catalog restarts Fabric Manager, a software restart (restart_app).",
    ),
    "WORKFLOW_NVLINK5_ERR": WorkflowRule(
        "RESET_GPU", "RESET_GPU", None,
        "NVLink 5 (Blackwell) error whose resolution needs the intrInfo decode this daemon does not read: "
        "treated as the NVLink workflow (reset the GPU).",
    ),
    "XID_154": WorkflowRule(
        "IGNORE", "IGNORE", None,
        "GPU recovery action changed: the action itself comes from NVML's recovery-action field "
        "(check gpu_recovery_action), so the event alone is informational.",
    ),
}


@dataclass(frozen=True)
class XidEntry:
    code: int
    name: str
    bucket: str | None  # None: the catalog lists the code without an action


#: code -> entry (Ampere and newer).
CATALOG: Mapping[int, XidEntry] = {e.code: e for e in (
    XidEntry(11, "Invalid or corrupted push buffer stream", "RESTART_APP"),
    XidEntry(13, "Graphics Engine Exception", "RESTART_APP"),
    XidEntry(25, "Invalid or illegal push buffer stream", "RESTART_APP"),
    XidEntry(31, "GPU memory page fault", "RESTART_APP"),
    XidEntry(32, "Invalid or corrupted push buffer stream", "RESTART_APP"),
    XidEntry(43, "GPU stopped processing", "IGNORE"),
    XidEntry(45, "Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45"),
    XidEntry(46, "GPU stopped processing", "RESET_GPU"),
    XidEntry(48, "Double Bit ECC Error", "WORKFLOW_XID_48"),
    XidEntry(62, "Internal micro-controller halt", "RESET_GPU"),
    XidEntry(63, "GPU memory remapping event", "IGNORE"),
    XidEntry(64, "GPU memory remapping failure", "RESET_GPU"),
    XidEntry(74, "NVLINK Error", "WORKFLOW_NVLINK_ERR"),
    XidEntry(79, "GPU has fallen off the bus", "RESTART_BM"),
    XidEntry(92, "High single-bit ECC error rate", "IGNORE"),
    XidEntry(94, "Contained memory error", "RESTART_APP"),
    XidEntry(95, "Uncontained memory error", "RESET_GPU"),
    XidEntry(109, "Context Switch Timeout Error", "RESET_GPU"),
    XidEntry(110, "Security Fault Error", "RESET_GPU"),
    XidEntry(119, "GSP RPC Timeout", "RESET_GPU"),
    XidEntry(120, "GSP Error", "RESET_GPU"),
    XidEntry(136, "Link Training Failed", "RESET_GPU"),
    XidEntry(137, "NVLink Privilege Error", "IGNORE"),
    XidEntry(140, "ECC Unrecovered Error", "RESET_GPU"),
    XidEntry(143, "GPU Initialization Error", "RESET_GPU"),
    XidEntry(144, "NVLINK: SAW Error", "WORKFLOW_NVLINK5_ERR"),
    XidEntry(145, "NVLINK: RLW Error", "WORKFLOW_NVLINK5_ERR"),
    XidEntry(146, "NVLINK: TLW Error", "WORKFLOW_NVLINK5_ERR"),
    XidEntry(147, "NVLINK: TREX Error", "WORKFLOW_NVLINK5_ERR"),
    XidEntry(148, "NVLINK: NVLPW_CTRL Error", "WORKFLOW_NVLINK5_ERR"),
    XidEntry(149, "NVLINK: NETIR Error", "WORKFLOW_NVLINK5_ERR"),
    XidEntry(150, "NVLINK: MSE Error", "WORKFLOW_NVLINK5_ERR"),
    XidEntry(151, "Key rotation Error", "RESTART_VM"),
    XidEntry(154, "GPU Recovery Action Changed", "XID_154"),
    XidEntry(155, "NVLINK: SW Defined Error", "RESET_GPU"),
    XidEntry(156, "Resource Retirement Event", "RESET_GPU"),
    XidEntry(157, "Resource Retirement Failure", "IGNORE"),
    XidEntry(158, "GPU Fatal Timeout", "RESET_GPU"),
    # Qualifiers of XID 48 (which memory faulted); the catalog gives them no action of their own.
    XidEntry(171, "Uncorrectable DRAM Error (qualifies XID 48)", "IGNORE"),
    XidEntry(172, "Uncorrectable SRAM Error (qualifies XID 48)", "IGNORE"),
)}


def resolve(
    code: int, others: frozenset[int] = frozenset(), catalog: Mapping[int, XidEntry] = CATALOG
) -> tuple[str, str, str]:
    """(severity, action, bucket) for XID ``code``, given the other codes seen in the window.

    A code not in the catalog, an entry without a bucket, or a bucket this module does not
    know all give UNKNOWN_BUCKET with bucket "UNKNOWN" (the caller logs it).
    """
    entry = catalog.get(code)
    bucket = entry.bucket if entry is not None else None
    if bucket in WORKFLOWS:
        rule = WORKFLOWS[bucket]
        companions = others - {code}
        hit = bool(companions) if rule.companions is None else bool(companions & rule.companions)
        bucket = rule.with_companion if hit else rule.solo
    if bucket is None or bucket not in BUCKETS:
        return (*UNKNOWN_BUCKET, "UNKNOWN")
    return (*BUCKETS[bucket], bucket)
