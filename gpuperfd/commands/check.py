"""``gpuperfd check``: node readiness in one command (Slurm prolog, Kubernetes pre-flight, burn-in).

Exit codes (docs/operations.md, README), none equal to a usage error's 2:

====  =====================================================================
0     every GPU healthy
10    degraded (the node's worst GPU)
11    unhealthy
12    could not check: a GPU unknown (no answer in time, a probe that could
      not run, ``--require-probe`` and a GPU not probed), no driver, no GPU
2     usage or configuration error (a GPU index that does not exist, a
      config file that does not parse): the message names the field
====  =====================================================================
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuperfd.config import DEFAULT_CONFIG_PATH, Config, config_with_flags, env_config_path
from gpuperfd.console import seconds_between
from gpuperfd.health.verdict import Verdict, node_verdict_json
from gpuperfd.probe_data.kinds import INTERCONNECT, check_kind
from gpuperfd.probe_data.spec import DEFAULT_PRESET, PRESETS, PROBES

if TYPE_CHECKING:
    from gpuperfd.probing.check.flow import CheckRequest

EXIT_HEALTHY, EXIT_DEGRADED, EXIT_UNHEALTHY, EXIT_UNKNOWN, EXIT_USAGE = 0, 10, 11, 12, 2
STATE_EXIT = {"healthy": EXIT_HEALTHY, "degraded": EXIT_DEGRADED, "unhealthy": EXIT_UNHEALTHY,
              "unknown": EXIT_UNKNOWN}
#: The default ``--timeout``: the whole run on a node of 8 GPUs, model build included.
DEFAULT_TIMEOUT_SECONDS = 60.0


def gpu_list(text: str) -> list[int]:
    """``0,2,5-7`` -> [0, 2, 5, 6, 7]; argparse turns a ValueError into a usage error (exit 2)."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        if not (low.isdigit() and (not dash or high.isdigit())):
            raise argparse.ArgumentTypeError(f"{part!r} is not a GPU index or range (e.g. 0,2,4-7)")
        if dash and int(high) < int(low):
            raise argparse.ArgumentTypeError(f"{part!r} is a reversed range: write {high}-{low}")
        out += list(range(int(low), int(high) + 1)) if dash else [int(low)]
    if not out:
        raise argparse.ArgumentTypeError("no GPU index given")
    return out


_timeout = seconds_between(1.0, 3600.0)


def register(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "check",
        help="is this node ready? passive checks, a short probe per idle GPU, one verdict and exit code",
        description="Check the node's GPUs once: the passive checks of the health table, then (unless --quick) "
        "a short read-only probe on every idle GPU in parallel, judged against its peers and the expected "
        "figures of its model. Exit 0 healthy, 10 degraded, 11 unhealthy, 12 could not check, 2 usage.",
    )
    parser.add_argument("--quick", action="store_true", help="passive checks only (under a second)")
    parser.add_argument("--gpus", type=gpu_list, metavar="LIST", help="GPU indices, e.g. 0,2,4-7 (default: all)")
    output = parser.add_mutually_exclusive_group()  # README: [--json | --line]
    output.add_argument("--json", action="store_true", help="print the verdict as JSON (the shape of GET /api/v1/health)")
    output.add_argument("--line", action="store_true",
                        help="print one line (state, action, each failing GPU's worst reason): for a Slurm drain "
                        "reason or a node-problem-detector message")
    parser.add_argument("--config", metavar="FILE", help=f"YAML config (default: $GPUPERFD_CONFIG or "
                        f"{DEFAULT_CONFIG_PATH} if it exists)")
    parser.add_argument("--simulate", type=int, metavar="N", help="N simulated GPUs (demos, tests)")
    parser.add_argument("--timeout", type=_timeout, default=CheckOptions.timeout, metavar="S",
                        help=f"bound on the whole run in seconds (default {DEFAULT_TIMEOUT_SECONDS:g}); "
                        "a GPU that does not answer in time is unknown")
    parser.add_argument("--require-probe", action="store_true",
                        help="a GPU that could not be probed is unknown (exit 12), not healthy (burn-in)")
    parser.add_argument("--probe", choices=PROBES, default=CheckOptions.probe, help="the check probe (default llm)")
    parser.add_argument("--preset", metavar="NAME",
                        help="its preset (default gpt2 for llm; the shipped figures are for the default presets)")
    parser.set_defaults(func=main)
    return parser


def _fmt_rate(evidence: dict[str, Any]) -> tuple[str, str, str, str]:
    rate, energy = evidence.get("units_per_second"), evidence.get("energy_per_unit_joules")
    unit = evidence.get("work_unit") or "unit"
    expected = evidence.get("expected") or {}
    measured = f"{rate:,.0f} {unit}/s" if isinstance(rate, (int, float)) else "-"
    want = expected.get("units_per_second")
    vs = f"{want:,.0f} ({rate / want:.0%})" if isinstance(want, (int, float)) and isinstance(rate, (int, float)) \
        else "peers only"
    joules = f"{energy * 1e3:.3g} mJ" if isinstance(energy, (int, float)) else "-"
    correct = (evidence.get("correctness") or {}).get("status", "not_checked")
    return measured, vs, joules, correct


def render_table(verdicts: list[Verdict], node: str, summary: dict[str, Any]) -> str:
    """Per GPU: state, action, what the probe measured against what was expected; then each reason."""
    body = node_verdict_json(verdicts, node)
    rows = [("GPU", "STATE", "ACTION", "MEASURED", "EXPECTED", "ENERGY/UNIT", "CORRECTNESS")]
    details: list[str] = []
    for gpu in body["gpus"]:
        label = "-" if gpu["gpu"] is None else str(gpu["gpu"])
        measured = next((r for r in gpu["reasons"] if r["check"] == "check_probe_measured"), None)
        failed = next((r for r in gpu["reasons"] if r["check"] == "check_probe_failed"), None)
        if measured:
            cols = _fmt_rate(measured["evidence"])
        elif failed:
            cols = (f"failed ({failed['evidence'].get('failure_reason')})", "-", "-", "-")
        else:
            cols = ("not probed", "-", "-", "-")
        rows.append((label, gpu["state"], gpu["action"], *cols))
        for reason, more in _grouped(gpu["reasons"]):
            if reason["check"] != "check_probe_measured":
                also = f" (and {len(more)} more alike: {', '.join(more)})" if more else ""
                details.append(f"  gpu {label}: [{reason['severity']}] {reason['check']}: {reason['message']}{also}")
            else:
                details.append(f"  gpu {label}: probe {reason['message']}")
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = [f"node {node}: {body['state']} (action {body['action']})"]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    phases = summary.get("phases_seconds", {})
    lines += details
    if (interconnect := summary.get(INTERCONNECT)) is not None:
        lines.append(interconnect_line(interconnect, body))
    lines.append(f"checked in {phases.get('total', 0):.1f} s (open {phases.get('open', 0):.1f}, passive "
                 f"{phases.get('passive', 0):.1f}, probe {phases.get('probe', 0):.1f}); read-only: no power cap changed")
    return "\n".join(lines)


#: The verdict's checks that judge the interconnect: the interconnect line is not "ok" beside one.
INTERCONNECT_CHECKS = ("interconnect_below_expected", "nvlink_links_below_topology", "nvlink_link_down")


def _grouped(reasons: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[str]]]:
    """A GPU's reasons with the repeats of one check folded into its first (the others' keys beside it):
    one link fault once gave nine lines of ``nvlink_links_below_topology``, one per peer."""
    out: list[tuple[dict[str, Any], list[str]]] = []
    first: dict[str, list[str]] = {}
    for reason in reasons:
        check = reason["check"]
        if check in first and check != "check_probe_measured":
            first[check].append(str(reason.get("key") or "?"))
            continue
        first[check] = []
        out.append((reason, first[check]))
    return out


def interconnect_line(result: dict[str, Any], body: dict[str, Any] | None = None) -> str:
    """The interconnect step in one line: its outcome, the slowest copy and each size's bus bandwidth.

    ``body`` (the node's verdict JSON): a run that finished but left a GPU with an interconnect reason is
    not "ok" (a copy at 50 % of the expected once read "ok, slowest copy 189 GB/s")."""
    if "not_run" in result:
        return f"interconnect: {result['not_run']}"
    gpus = ",".join(map(str, result.get("gpus") or ()))
    if result.get("status") != "ok":
        return (f"interconnect GPUs {gpus}: {result.get('status')} ({result.get('failure_reason')}): "
                f"{str(result.get('error_message') or '').splitlines()[0] if result.get('error_message') else ''}")
    copies = [c["bandwidth_bytes_per_second"] for c in result.get("copies") or ()]
    sizes = ", ".join(f"{a['bytes'] / 2**20:g} MiB {a['bus_bandwidth_bytes_per_second'] / 1e9:.1f} GB/s"
                      for a in result.get("allreduce") or ())
    slowest = f"slowest copy {min(copies) / 1e9:.1f} GB/s, " if copies else ""
    judged = sorted({g["gpu"] for g in (body or {}).get("gpus", []) if g["gpu"] is not None
                     and any(r["check"] in INTERCONNECT_CHECKS for r in g["reasons"])})
    outcome = (f"ran, below expected on GPU(s) {','.join(map(str, judged))} (their reasons above)" if judged
               else "ok")
    extra = result.get("extra") or {}
    retested = "".join(f"; measured again {', '.join(r['pairs'])}: {r.get('after') or 'slow every time'}"
                       for r in extra.get("retests") or () if r.get("pairs"))
    unconfirmed = "".join(f"; {pair} not judged (unknown): {why}" for pair, why in (extra.get("unconfirmed") or {}).items())
    return f"interconnect GPUs {gpus}: {outcome}, {slowest}all-reduce busbw {sizes}, sums ok{retested}{unconfirmed}"


def one_line(body: dict[str, Any], limit: int = 240) -> str:
    """``unhealthy (reset_gpu): gpu 1 ecc_uncorrectable_volatile: 2 uncorrectable ...; gpu 3 ...``."""
    bad = []
    for gpu in body["gpus"]:
        worst = next((r for r in gpu["reasons"] if r["severity"] != "info"), None)
        if worst is not None:
            label = "missing GPU" if gpu["gpu"] is None else f"gpu {gpu['gpu']}"
            bad.append(f"{label} {worst['check']}: {worst['message']}")
    if not bad:
        probed = len((body.get("check") or {}).get("probed") or [])
        text = f"healthy: {len(body['gpus'])} GPU(s), {probed} probed"
    else:
        text = f"{body['state']} ({body['action']}): " + "; ".join(bad)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class CheckOptions:
    """``gpuperfd check``'s flags, typed once (see :func:`register` for what each means)."""

    quick: bool = False
    gpus: list[int] | None = None
    json: bool = False
    line: bool = False
    config: str | None = None
    simulate: int | None = None
    timeout: float = DEFAULT_TIMEOUT_SECONDS
    require_probe: bool = False
    probe: str = check_kind().name
    preset: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CheckOptions:
        values = vars(args)
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})

    def request(self) -> CheckRequest:
        """The check the flags ask for; ValueError naming ``--preset`` for another probe's preset."""
        from gpuperfd.probing.check.flow import CheckRequest

        preset = self.preset or DEFAULT_PRESET[self.probe]
        if preset not in PRESETS[self.probe]:
            raise ValueError(f"--preset: {preset!r} is not a {self.probe} preset ({', '.join(PRESETS[self.probe])})")
        return CheckRequest(gpus=self.gpus, quick=self.quick, timeout_seconds=self.timeout,
                            require_probe=self.require_probe, probe=self.probe, preset=preset)

    def load_config(self) -> Config:
        """The config file (``--config``, ``$GPUPERFD_CONFIG`` or the default path) with ``--simulate``, and
        the device call gate's timeout (:mod:`gpuperfd.device.serial`, the one bound on a hung call) at most
        a quarter of the passive read's budget: the other GPUs' reads, queued behind a hung call, still
        finish within it. ConfigError: exit 2 in ``cli.main``."""
        from gpuperfd.probing.check.flow import passive_budget

        path = self.config or env_config_path()
        if path is None and DEFAULT_CONFIG_PATH.exists():
            path = str(DEFAULT_CONFIG_PATH)
        configured = config_with_flags(path, {}, simulate=self.simulate).device.call_timeout_seconds
        bound = min(configured, passive_budget(self.timeout) / HANG_SHARE_OF_PASSIVE)
        return config_with_flags(path, {"device.call_timeout_seconds": bound}, simulate=self.simulate)


#: The passive read's budget over this is the longest a device call may hang in a check.
HANG_SHARE_OF_PASSIVE = 4.0


def main(args: argparse.Namespace) -> int:
    from gpuperfd.probing.check.flow import CannotCheck, CheckUsageError, run_check

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="gpuperfd check: %(levelname)s %(message)s")
    options = CheckOptions.from_args(args)
    config = options.load_config()
    try:
        request = options.request()
    except ValueError as exc:
        print(f"gpuperfd check: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        outcome = run_check(config, request)
    except CheckUsageError as exc:
        print(f"gpuperfd check: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CannotCheck as exc:
        print(f"gpuperfd check: could not check: {exc}", file=sys.stderr)
        if options.json:
            print(json.dumps(node_verdict_json([], config.simulation.node or outcome_node(),
                                               check={"error": str(exc)}) | {"state": "unknown"}, indent=2))
        elif options.line:
            print(f"unknown: could not check: {exc}"[:240])
        return EXIT_UNKNOWN
    node = config.simulation.node or outcome.node
    summary = outcome.summary()
    body = node_verdict_json(outcome.verdicts, node, check=summary)
    if options.json:
        print(json.dumps(body, indent=2))
    elif options.line:
        print(one_line(body))
    else:
        print(render_table(outcome.verdicts, node, summary))
    return STATE_EXIT[node_verdict_json(outcome.verdicts, node)["state"]]


def outcome_node() -> str:
    import socket

    return socket.gethostname()
