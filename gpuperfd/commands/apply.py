"""``gpuperfd apply --status``, ``--revert`` and ``--release GPU``: what apply mode holds, every
operator's cap back by hand, and a GPU an operator took from apply mode given back to it.

Both read the cap journal (every state directory this node used, as ``restore-caps`` does).
``--revert`` is the emergency command (:mod:`gpuperfd.caps.emergency`, the same as ``restore-caps``):
every entry of ours (apply mode's and a sweep's) is put back under its GPU's cap lock, by the rule that
writes only over a cap we set, read back, and only then cleared; the output says what each board reads
afterwards. A running daemon never races it (it needs the same lock for its pass) and, finding its
entry gone and the operator's cap back, leaves the GPU quietly.

``--release GPU`` ends an operator's hold (:mod:`gpuperfd.caps.holds`): a GPU whose cap an operator set
by hand stays out of apply mode, across restarts and reloads, until this (or the daemon's
``POST /api/v1/apply/release?gpu=N``) gives it back; a running daemon takes it at its next pass.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from gpuperfd.caps.emergency import Restored, restore_everything, state_dir_problem
from gpuperfd.caps.holds import OperatorHold, ReleaseError, holds_in, release_hold
from gpuperfd.caps.journal import CapJournal, CapRecord, CorruptJournal, journals_for
from gpuperfd.caps.ownership import apply_lock_name, is_owned, safe_name
from gpuperfd.device.base import Device
from gpuperfd.device.errors import DeviceError

if TYPE_CHECKING:
    from gpuperfd.config import Config

#: ``--revert``'s result per entry (the emergency command's).
Reverted = Restored


def status_lines(journals: Iterable[CapJournal]) -> list[str]:
    """One line per journal entry, applied, a sweep's or unreadable, by GPU index: what ``--revert``
    would act on (issue 61: a killed sweep's entry and a corrupt one were "no applied cap")."""
    found = [(journal, path, entry) for journal in journals for path, entry in journal.entries()]
    found.sort(key=lambda item: (item[2].gpu_index, item[2].uuid) if isinstance(item[2], CapRecord)
               else (sys.maxsize, str(item[1])))
    return [_entry_line(journal, entry) for journal, _, entry in found]


def _entry_line(journal: CapJournal, entry: CapRecord | CorruptJournal) -> str:
    """One entry in words: whose cap it is, what the journal keeps, who holds it now."""
    if isinstance(entry, CorruptJournal):
        return f"{entry}: --revert sets its GPU to the default limit (the safe choice)"
    if entry.applied_watts is not None:
        held = is_owned(journal.state_dir, apply_lock_name(safe_name(entry.uuid)))
        who = f"held by pid {held}" if held is not None else "no daemon holds it: restored at the next start"
        return (f"gpu {entry.gpu_index} {entry.uuid}: {entry.applied_watts:.0f} W applied, operator's "
                f"{entry.original_watts:.0f} W journaled ({who})")
    held = is_owned(journal.state_dir, safe_name(entry.uuid))
    who = (f"a sweep, pid {held}, holds it and restores it when it ends" if held is not None
           else f"its sweep (pid {entry.pid}) is gone: --revert or the next start puts it back")
    return (f"gpu {entry.gpu_index} {entry.uuid}: a sweep's cap, operator's {entry.original_watts:.0f} W "
            f"journaled ({who})")


def print_status(config: Config, journals: Sequence[CapJournal]) -> None:
    """``--status``: the mode, then every entry (a state directory never made holds none, exit 0), then the
    GPUs operators hold."""
    print(f"apply mode: {config.apply.mode} (workload {config.apply.workload or '-'}, "
          f"budget {100 * config.apply.budget_ratio:.1f}%)")
    lines = status_lines(journals)
    for line in lines:
        print(line)
    if not lines:
        searched = ", ".join(str(j.state_dir) + ("" if j.state_dir.exists() else " (does not exist)") for j in journals)
        print(f"no applied cap: no power-cap journal entry in {searched}")
    for hold in holds_in(journal.state_dir for journal in journals):
        print(hold_line(hold))


def revert(journals: Iterable[CapJournal], devices: Sequence[Device], wait_seconds: float = 10.0) -> list[Restored]:
    """Every entry of ours put back (:func:`restore_everything`); GPUs not on this node keep their entries."""
    return restore_everything(journals, devices, wait_seconds)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "apply", help="show or revert the power caps apply mode holds (docs/apply.md)",
        description="Apply mode runs in the daemon (the apply: section). This shows what it holds, "
                    "or puts every operator's cap back (--revert), verified by reading back.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--status", action="store_true", help="list the applied caps the journal holds")
    what.add_argument("--revert", action="store_true", help="restore every operator cap apply mode replaced")
    what.add_argument("--release", type=int, metavar="GPU",
                      help="give GPU (an index) back to apply mode after an operator set its cap by hand")
    parser.add_argument("--config", metavar="FILE")
    parser.add_argument("--state-dir", metavar="DIR")
    parser.add_argument("--simulate", type=int, metavar="N")
    parser.set_defaults(func=cmd_apply)


def cmd_apply(args: argparse.Namespace) -> int:
    """--status: 0 (a configured state directory never made holds nothing; a named one that is missing is
    a mistake: 2). --release: :func:`cmd_release`. --revert: 0 when every cap of ours is back (or there was
    none), 1 otherwise, 2 when the state directory is missing or unreadable, 3 when the GPUs cannot be opened."""
    from gpuperfd.config import config_with_flags
    from gpuperfd.device.factory import with_devices

    config = config_with_flags(args.config, {"probes.state_dir": args.state_dir}, simulate=args.simulate)
    problem = state_dir_problem(config.probes.state_dir)
    if args.status and problem is not None and args.state_dir is None and not config.probes.state_dir.exists():
        problem = None  # the configured directory was never made: nothing was journaled there (said below)
    if problem is not None:  # never "nothing to revert" for a journal that could not be read
        print(f"gpuperfd: apply: {problem}", file=sys.stderr)
        return 2
    journals = journals_for(config)
    if args.status:
        print_status(config, journals)
        return 0
    if args.release is not None:
        return cmd_release(config, [journal.state_dir for journal in journals], args.release)
    if not any(journal.entries() for journal in journals):
        searched = ", ".join(str(j.state_dir) for j in journals)
        print(f"gpuperfd: apply: nothing to revert (no power-cap journal entry in {searched})")
        return 0
    try:
        results = with_devices(config, lambda devices: revert(journals, devices))
    except DeviceError as exc:
        print(f"gpuperfd: {exc}", file=sys.stderr)
        return 3
    for result in results:
        print(result.words, file=sys.stdout if result.ok else sys.stderr)
    return 0 if all(r.ok for r in results) else 1


def hold_line(hold: OperatorHold) -> str:
    """One operator's hold in words: the GPU, the operator's cap, since when, and how to give it back."""
    return (f"gpu {hold.gpu_index} {hold.uuid}: held by the operator at {hold.watts:.0f} W since {hold.since_text()}; "
            f"apply mode leaves it until given back (gpuperfd apply --release {hold.gpu_index})")


def cmd_release(config: Any, state_dirs: list[Any], gpu: int) -> int:
    """0: the GPU's hold is gone (a running daemon takes the GPU at its next pass); 2: no such GPU or
    no operator holds it (named); 3: the GPUs cannot be opened."""
    from gpuperfd.device.factory import with_devices

    try:
        hold = with_devices(config, lambda devices: release_hold(state_dirs, devices, gpu))
    except (ReleaseError, DeviceError) as exc:
        print(f"gpuperfd: apply --release: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ReleaseError) else 3
    print(f"gpu {gpu}: given back to apply mode (the operator's {hold.watts:.0f} W held since {hold.since_text()}); "
          f"a running daemon in apply mode may set its cap at its next pass")
    return 0
