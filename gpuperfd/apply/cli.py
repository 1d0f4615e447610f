"""``gpuperfd apply --status`` and ``gpuperfd apply --revert``: what apply mode holds, and every
operator's cap back by hand.

Both read the cap journal (every state directory this node used, as ``restore-caps`` does). An
entry with an applied cap is apply mode's; ``--revert`` puts its operator's cap back under the GPU's
cap lock, reads it back and only then clears the entry. A daemon that still holds its apply lock
sees its cap changed and leaves the GPU alone (it never fights a cap someone else set), so
``--revert`` works with the daemon running.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuperfd.device.base import Device
from gpuperfd.device.errors import DeviceError
from gpuperfd.probing.sweep.journal import CapJournal, CapRecord, journals_for
from gpuperfd.probing.sweep.ownership import GpuBusy, GpuLock, apply_lock_name, is_owned, safe_name


@dataclass(frozen=True)
class Reverted:
    """One applied cap put back (or not) by ``--revert``."""

    gpu: int
    ok: bool
    words: str


def applied_entries(journals: Iterable[CapJournal]) -> list[tuple[CapJournal, CapRecord]]:
    """Every journal entry that holds an applied cap (apply mode's), across the given journals, by GPU
    index (the journal's file order is the UUIDs')."""
    entries = [(journal, entry) for journal in journals for _, entry in journal.entries()
               if isinstance(entry, CapRecord) and entry.applied_watts is not None]
    return sorted(entries, key=lambda pair: (pair[1].gpu_index, pair[1].uuid))


def revert(journals: Iterable[CapJournal], devices: Sequence[Device], wait_seconds: float = 10.0) -> list[Reverted]:
    """Put back the operator's cap of every applied entry, verified by reading back; an entry is
    cleared only once its cap reads back. GPUs not on this node keep their entries."""
    by_name: dict[str, Device] = {}
    for device in devices:
        try:
            by_name[safe_name(device.info().uuid)] = device
        except DeviceError:
            continue
    done: list[Reverted] = []
    for journal, entry in applied_entries(journals):
        device = by_name.get(safe_name(entry.uuid))
        if device is None:
            done.append(Reverted(entry.gpu_index, False, f"GPU {entry.uuid} is not on this node; entry kept"))
            continue
        done.append(_revert_one(journal, entry, device, wait_seconds))
    return done


def _revert_one(journal: CapJournal, entry: CapRecord, device: Device, wait_seconds: float) -> Reverted:
    lock = GpuLock(journal.state_dir, safe_name(entry.uuid))
    try:
        lock.acquire(wait_seconds=wait_seconds)
    except (GpuBusy, OSError) as exc:
        return Reverted(device.index, False, f"gpu {device.index}: not reverted: {exc}")
    try:
        device.set_power_limit(entry.original_watts)
        back = device.power_limits().enforced_watts
        if round(back) != round(entry.original_watts):
            return Reverted(device.index, False, f"gpu {device.index}: set {entry.original_watts:.0f} W but it reads "
                                                 f"back {back:.0f} W; journal kept")
        journal.clear(entry.uuid)
    except DeviceError as exc:
        return Reverted(device.index, False, f"gpu {device.index}: not reverted ({exc}); journal kept")
    finally:
        lock.release()
    held = is_owned(journal.state_dir, apply_lock_name(safe_name(entry.uuid)))
    note = f"; the daemon (pid {held}) sees the change and leaves this GPU alone" if held is not None else ""
    return Reverted(device.index, True, f"gpu {device.index}: operator's cap {entry.original_watts:.0f} W back "
                                        f"(was {entry.applied_watts:.0f} W applied), reads back {back:.0f} W{note}")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "apply", help="show or revert the power caps apply mode holds (docs/apply.md)",
        description="Apply mode runs in the daemon (the apply: section). This shows what it holds, "
                    "or puts every operator's cap back (--revert), verified by reading back.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--status", action="store_true", help="list the applied caps the journal holds")
    what.add_argument("--revert", action="store_true", help="restore every operator cap apply mode replaced")
    parser.add_argument("--config", metavar="FILE")
    parser.add_argument("--state-dir", metavar="DIR")
    parser.add_argument("--simulate", type=int, metavar="N")
    parser.set_defaults(func=cmd_apply)


def cmd_apply(args: argparse.Namespace) -> int:
    """--status: 0. --revert: 0 when every applied cap is back (or there was none), 1 otherwise, 3 when
    the GPUs cannot be opened; 2 for a --state-dir that is not a directory."""
    from gpuperfd.config import config_with_flags
    from gpuperfd.device.factory import with_devices

    config = config_with_flags(args.config, {"probes.state_dir": args.state_dir}, simulate=args.simulate)
    if args.state_dir is not None and not config.probes.state_dir.is_dir():  # a typo is not "no applied cap"
        what = "is not a directory" if config.probes.state_dir.exists() else "does not exist"
        print(f"gpuperfd: apply: --state-dir {args.state_dir} {what}: no cap journal there", file=sys.stderr)
        return 2
    journals = journals_for(config)
    entries = applied_entries(journals)
    if args.status:
        print(f"apply mode: {config.apply.mode} (workload {config.apply.workload or '-'}, "
              f"budget {100 * config.apply.budget_ratio:.1f}%)")
        for journal, entry in entries:
            held = is_owned(journal.state_dir, apply_lock_name(safe_name(entry.uuid)))
            who = f"held by pid {held}" if held is not None else "no daemon holds it: restored at the next start"
            print(f"gpu {entry.gpu_index} {entry.uuid}: {entry.applied_watts:.0f} W applied, operator's "
                  f"{entry.original_watts:.0f} W journaled ({who})")
        if not entries:
            print("no applied cap")
        return 0
    if not entries:
        print("gpuperfd: apply: nothing to revert (no applied cap in the journal)")
        return 0
    try:
        results = with_devices(config, lambda devices: revert(journals, devices))
    except DeviceError as exc:
        print(f"gpuperfd: {exc}", file=sys.stderr)
        return 3
    for result in results:
        print(result.words, file=sys.stdout if result.ok else sys.stderr)
    return 0 if all(r.ok for r in results) else 1
