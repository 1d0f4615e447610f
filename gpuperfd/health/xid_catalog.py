"""NVIDIA's XID catalog as plain data: code -> name and immediate-action bucket.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), column "Resolution
Bucket (Immediate Action)", Ampere and newer. CATALOG_PROVENANCE says how each row was
checked: the stored copy of that page shows its header and first rows (XID 1-13, which
agree with this table); the bucket of every row was checked against NVIDIA's own
machine-readable copy of that column in NVIDIA/NVSentinel (CATALOG_MIRROR, at
CATALOG_MIRROR_COMMIT). Codes the catalog marks unused on Ampere+ (bucket CONTACT_SUPPORT,
"N/A; Unused") are deliberately left out: an unused code that appears is handled as an
unknown code, whose action is contact_support as well.

Buckets map to our actions in BUCKETS. Workflow buckets (48, 74, 45, 144-150) get a rule
(``WorkflowRule``): a solo bucket and, when a companion XID was seen in the same window, another.
A code the table does not list, or an entry without a bucket, is handled as UNKNOWN_BUCKET
(docs/health.md "Bad input"): verdict ``unknown``, never a silent ``healthy``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
CATALOG_MIRROR = ("https://github.com/NVIDIA/NVSentinel/blob/main/distros/kubernetes/nvsentinel/charts/"
                  "gpu-health-monitor/xiderrorsmapping.csv")
CATALOG_MIRROR_COMMIT = "6f8b0fcfa8e502bdda78fabf96facef729a9285b"
#: When the rows were last checked against the sources (not a revision date printed by NVIDIA:
#: the stored copy of the page shows none).
CATALOG_CHECKED = "2026-11-25"
CATALOG_PROVENANCE = (
    f"Checked on {CATALOG_CHECKED}: the stored copy of NVIDIA's page (it shows no revision date) "
    "gives the header and rows XID 1-13, which agree with this table; every row's bucket was checked "
    "against NVIDIA's machine-readable copy of the Immediate Action column in NVIDIA/NVSentinel "
    f"([xiderrorsmapping.csv]({CATALOG_MIRROR}), commit {CATALOG_MIRROR_COMMIT[:12]}). The earlier "
    "transcription, from a secondary source, agreed on every bucket it listed but missed about 60 codes "
    "in use on Ampere+ (added) and listed XID 171/172 (DRAM/SRAM qualifiers of XID 48), which neither "
    "NVIDIA source lists (removed: they are now unknown codes; the XID 48 they accompany decides the "
    "verdict). Names are NVIDIA's descriptions where known, otherwise NVIDIA's mnemonic. Codes the "
    "catalog marks unused on Ampere+ are left out on purpose (handled as unknown codes). Re-check "
    "against the live page when updating."
)

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
    # The application's use of Unified Memory (nvidia-uvm) needs a look; the GPU stays usable.
    "CHECK_UVM": ("info", "restart_app"),
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


#: code -> entry (Ampere and newer; codes in use only, see the module docstring).
CATALOG: Mapping[int, XidEntry] = {e.code: e for e in (
    XidEntry(8, "GPU stopped processing (idle timeout)", "RESTART_APP"),
    XidEntry(11, "Invalid or corrupted push buffer stream", "RESTART_APP"),
    XidEntry(13, "Graphics Engine Exception", "RESTART_APP"),
    XidEntry(14, "ROBUST_CHANNEL_FAKE_ERROR", "IGNORE"),
    XidEntry(25, "Invalid or illegal push buffer stream", "RESTART_APP"),
    XidEntry(31, "GPU memory page fault", "RESTART_APP"),
    XidEntry(32, "Invalid or corrupted push buffer stream", "RESTART_APP"),
    XidEntry(37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "IGNORE"),
    XidEntry(38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "IGNORE"),
    XidEntry(39, "ROBUST_CHANNEL_CE0_ERROR", "RESTART_APP"),
    XidEntry(40, "ROBUST_CHANNEL_CE1_ERROR", "RESTART_APP"),
    XidEntry(41, "ROBUST_CHANNEL_CE2_ERROR", "RESTART_APP"),
    XidEntry(43, "GPU stopped processing", "IGNORE"),
    XidEntry(44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "IGNORE"),
    XidEntry(45, "Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45"),
    XidEntry(46, "GPU stopped processing", "RESET_GPU"),
    XidEntry(48, "Double Bit ECC Error", "WORKFLOW_XID_48"),
    XidEntry(54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "CHECK_MECHANICALS"),
    XidEntry(60, "ROBUST_CHANNEL_SEC2_ERROR", "RESTART_APP"),
    XidEntry(62, "Internal micro-controller halt", "RESET_GPU"),
    XidEntry(63, "GPU memory remapping event", "IGNORE"),
    XidEntry(64, "GPU memory remapping failure", "RESET_GPU"),
    XidEntry(66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "IGNORE"),
    XidEntry(67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "IGNORE"),
    XidEntry(68, "ROBUST_CHANNEL_NVDEC0_ERROR", "RESTART_APP"),
    XidEntry(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "RESTART_APP"),
    XidEntry(70, "ROBUST_CHANNEL_CE3_ERROR", "RESTART_APP"),
    XidEntry(71, "ROBUST_CHANNEL_CE4_ERROR", "RESTART_APP"),
    XidEntry(72, "ROBUST_CHANNEL_CE5_ERROR", "RESTART_APP"),
    XidEntry(74, "NVLINK Error", "WORKFLOW_NVLINK_ERR"),
    XidEntry(75, "ROBUST_CHANNEL_CE6_ERROR", "RESTART_APP"),
    XidEntry(76, "ROBUST_CHANNEL_CE7_ERROR", "RESTART_APP"),
    XidEntry(77, "ROBUST_CHANNEL_CE8_ERROR", "RESTART_APP"),
    XidEntry(78, "VGPU_START_ERROR", "UPDATE_SWFW"),
    XidEntry(79, "GPU has fallen off the bus", "RESTART_BM"),
    XidEntry(80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "RESTART_APP"),
    XidEntry(82, "ROBUST_CHANNEL_NVJPG0_ERROR", "RESTART_APP"),
    XidEntry(83, "ROBUST_CHANNEL_NVDEC1_ERROR", "RESTART_APP"),
    XidEntry(84, "ROBUST_CHANNEL_NVDEC2_ERROR", "RESTART_APP"),
    XidEntry(85, "ROBUST_CHANNEL_CE9_ERROR", "RESTART_APP"),
    XidEntry(86, "ROBUST_CHANNEL_OFA0_ERROR", "RESTART_APP"),
    XidEntry(88, "ROBUST_CHANNEL_NVDEC3_ERROR", "RESTART_APP"),
    XidEntry(89, "ROBUST_CHANNEL_NVDEC4_ERROR", "RESTART_APP"),
    XidEntry(92, "High single-bit ECC error rate", "IGNORE"),
    XidEntry(93, "INFOROM_ERASE_LIMIT_EXCEEDED", "IGNORE"),
    XidEntry(94, "Contained memory error", "RESTART_APP"),
    XidEntry(95, "Uncontained memory error", "RESET_GPU"),
    XidEntry(96, "ROBUST_CHANNEL_NVDEC5_ERROR", "RESTART_APP"),
    XidEntry(97, "ROBUST_CHANNEL_NVDEC6_ERROR", "RESTART_APP"),
    XidEntry(98, "ROBUST_CHANNEL_NVDEC7_ERROR", "RESTART_APP"),
    XidEntry(99, "ROBUST_CHANNEL_NVJPG1_ERROR", "RESTART_APP"),
    XidEntry(100, "ROBUST_CHANNEL_NVJPG2_ERROR", "RESTART_APP"),
    XidEntry(101, "ROBUST_CHANNEL_NVJPG3_ERROR", "RESTART_APP"),
    XidEntry(102, "ROBUST_CHANNEL_NVJPG4_ERROR", "RESTART_APP"),
    XidEntry(103, "ROBUST_CHANNEL_NVJPG5_ERROR", "RESTART_APP"),
    XidEntry(104, "ROBUST_CHANNEL_NVJPG6_ERROR", "RESTART_APP"),
    XidEntry(105, "ROBUST_CHANNEL_NVJPG7_ERROR", "RESTART_APP"),
    XidEntry(106, "SMBPBI_TEST_MESSAGE", "IGNORE"),
    XidEntry(107, "SMBPBI_TEST_MESSAGE_SILENT", "IGNORE"),
    XidEntry(109, "Context Switch Timeout Error", "RESET_GPU"),
    XidEntry(110, "Security Fault Error", "RESET_GPU"),
    XidEntry(119, "GSP RPC Timeout", "RESET_GPU"),
    XidEntry(120, "GSP Error", "RESET_GPU"),
    XidEntry(121, "C2C_ERROR", "IGNORE"),
    XidEntry(126, "ROBUST_CHANNEL_CE10_ERROR", "RESTART_APP"),
    XidEntry(127, "ROBUST_CHANNEL_CE11_ERROR", "RESTART_APP"),
    XidEntry(128, "ROBUST_CHANNEL_CE12_ERROR", "RESTART_APP"),
    XidEntry(129, "ROBUST_CHANNEL_CE13_ERROR", "RESTART_APP"),
    XidEntry(130, "ROBUST_CHANNEL_CE14_ERROR", "RESTART_APP"),
    XidEntry(131, "ROBUST_CHANNEL_CE15_ERROR", "RESTART_APP"),
    XidEntry(132, "ROBUST_CHANNEL_CE16_ERROR", "RESTART_APP"),
    XidEntry(133, "ROBUST_CHANNEL_CE17_ERROR", "RESTART_APP"),
    XidEntry(134, "ROBUST_CHANNEL_CE18_ERROR", "RESTART_APP"),
    XidEntry(135, "ROBUST_CHANNEL_CE19_ERROR", "RESTART_APP"),
    XidEntry(136, "Link Training Failed", "RESET_GPU"),
    XidEntry(137, "NVLink Privilege Error", "IGNORE"),
    XidEntry(139, "ROBUST_CHANNEL_OFA1_ERROR", "RESTART_APP"),
    XidEntry(140, "ECC Unrecovered Error", "RESET_GPU"),
    XidEntry(141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "IGNORE"),
    XidEntry(143, "GPU Initialization Error", "RESET_GPU"),
    XidEntry(144, "NVLINK: SAW Error", "WORKFLOW_NVLINK5_ERR"),
    XidEntry(145, "NVLINK: RLW Error", "WORKFLOW_NVLINK5_ERR"),
    XidEntry(146, "NVLINK: TLW Error", "WORKFLOW_NVLINK5_ERR"),
    XidEntry(147, "NVLINK: TREX Error", "WORKFLOW_NVLINK5_ERR"),
    XidEntry(148, "NVLINK: NVLPW_CTRL Error", "WORKFLOW_NVLINK5_ERR"),
    XidEntry(149, "NVLINK: NETIR Error", "WORKFLOW_NVLINK5_ERR"),
    XidEntry(150, "NVLINK: MSE Error", "WORKFLOW_NVLINK5_ERR"),
    XidEntry(151, "Key rotation Error", "RESTART_VM"),
    XidEntry(152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "IGNORE"),
    XidEntry(153, "ROBUST_CHANNEL_DLA_TIMEOUT", "IGNORE"),
    XidEntry(154, "GPU Recovery Action Changed", "XID_154"),
    XidEntry(155, "NVLINK: SW Defined Error", "RESET_GPU"),
    XidEntry(156, "Resource Retirement Event", "RESET_GPU"),
    XidEntry(157, "Resource Retirement Failure", "IGNORE"),
    XidEntry(158, "GPU Fatal Timeout", "RESET_GPU"),
    XidEntry(159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHECK_UVM"),
    XidEntry(160, "CHANNEL_RETIREMENT_EVENT", "RESTART_BM"),
    XidEntry(161, "CHANNEL_RETIREMENT_FAILURE", "IGNORE"),
    XidEntry(162, "XID 162 (no mnemonic in the mirror)", "RESET_GPU"),
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
