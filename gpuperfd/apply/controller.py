"""The daemon's side of apply mode: journal the operator's cap, set the recommended one, watch it,
give it back by itself.

One pass per GPU (:meth:`ApplyController.tick`, every ``apply.interval_seconds`` on its own thread).
A pass first *looks* without the GPU's turn or its cap lock (:class:`~gpuperfd.caps.ownership.GpuLock`):
a pass that changes no cap (the applied cap holds, a GPU held back for the same reason) takes neither, so
a probe round never waits for it. Only a pass with a change due (apply, roll back, leave, restore a dead
writer's cap), or one that cannot look because a writer holds the cap lock, takes the GPU's turn (in the
daemon: :class:`~gpuperfd.probing.gates.turns.GpuTurns`, the line the rounds and interconnect runs wait
in), then the lock, and decides again under both, as every writer does. So no round of the daemon ever
finds the cap lock held by apply mode; the lock still keeps out other processes (a CLI sweep, whose
GPU is looked at again in the next pass). A sweep that owns the cap now is left alone (it returns to the
applied cap itself, :class:`~gpuperfd.caps.guard.CapGuard`). Without turns (the controller built
outside the daemon) the cap lock alone guards the change.
A GPU without an applied cap is judged by :func:`~gpuperfd.apply.policy.decide`; one with a cap by
:func:`~gpuperfd.apply.policy.check_applied`, which rolls it back (verdict, drift, a failed probe at the
applied cap, a loss over budget) or, when someone else changed it, leaves it to them.

Applying: the operator's cap goes into the same journal as a sweep's (:class:`CapJournal`, with the
applied cap beside it) *before* the cap changes, and the daemon holds the GPU's apply lock
(:func:`~gpuperfd.caps.ownership.apply_lock_name`) while the cap stands: a daemon that dies
drops the lock and the next start (or ``gpuperfd restore-caps``) puts the operator's cap back; a live
one is never restored under.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpuperfd.apply.metrics import ApplyMetrics
from gpuperfd.apply.policy import (ApplySettings, GpuFacts, check_applied, decide, in_canary, realized)
from gpuperfd.caps.holds import OperatorHold, hold_of, release_hold, write_hold
from gpuperfd.caps.journal import (CapJournal, CapRecord, JournalWriteError, put_back, read_registry,
                                   restore_pending)
from gpuperfd.caps.ownership import GpuBusy, GpuLock, apply_lock_name, is_owned, safe_name
from gpuperfd.device.base import Device, PowerLimits
from gpuperfd.device.errors import DeviceError
from gpuperfd.health.verdict import Verdict
from gpuperfd.probe_data.recommend import SweepPoint
from gpuperfd.probing.gates.turns import GpuTurns, Holder, HolderKind, Release, Turn

log = logging.getLogger(__name__)


class PointBook:
    """The workload's latest point per cap per GPU, failed points included (they are evidence too);
    fed by the probe service's point listener. Skipped, aborted and preempted points measured nothing."""

    def __init__(self) -> None:
        self._points: dict[int, dict[int, SweepPoint]] = {}
        self._lock = threading.Lock()

    def observe(self, gpu: int, point: SweepPoint) -> None:
        result = point.result
        if result.status in ("skipped", "aborted") or result.preempted:
            if point.sweep_id is not None and (result.status == "aborted" or result.preempted):
                with self._lock:  # its sweep was cut short: its points recommend nothing (probe_data/recommend.py)
                    held = self._points.get(gpu, {})
                    for cap, kept in held.items():
                        if kept.sweep_id == point.sweep_id:
                            held[cap] = dataclasses.replace(kept, sweep_cut_short=True)
            return
        with self._lock:
            self._points.setdefault(gpu, {})[round(point.cap_watts)] = point

    def of(self, gpu: int) -> list[SweepPoint]:
        with self._lock:
            return list(self._points.get(gpu, {}).values())

    def clear(self) -> None:
        with self._lock:
            self._points.clear()


#: Hold reasons of a GPU whose cap apply mode never changes (no rollback counters for it).
OUT_OF_SCOPE: frozenset[str] = frozenset({"off", "not_canary", "advise", "not_supported"})


@dataclass
class GpuApply:
    """One GPU's apply state; ``reason`` is one of :data:`~gpuperfd.apply.policy.HOLD_REASONS`."""

    reason: str = "off"
    detail: str = ""
    advised_watts: float | None = None
    applied_watts: float | None = None
    operator_watts: float | None = None
    applied_at: float = 0.0
    #: Someone else changed the cap we set (their cap stands).
    overridden: bool = False
    #: Rolled back or overridden: this GPU stays out of apply mode (its reason kept) until the mode,
    #: the workload or the canary changes, or the daemon restarts; no flapping between caps.
    out: bool = False
    #: The operator's hold on this GPU (holds.py): when it began; None while no operator holds it.
    #: A hold outlives restarts and reloads; only the operator's release ends it.
    held_since: float | None = None
    hold: GpuLock | None = field(default=None, repr=False)


#: Apply mode's holder of a GPU's turn: a pass's change, and a revert (a reload, the daemon's stop).
PASS_HOLDER = Holder(HolderKind.APPLY, "apply pass")
REVERT_HOLDER = Holder(HolderKind.APPLY, "apply revert")


class _ChangeDue(Exception):
    """A look (a pass without the cap lock) reached a cap change: the pass takes the lock and decides again."""


class ApplyController:
    """Applies, watches and rolls back the recommended cap of each GPU (thread-safe; one pass at a time)."""

    def __init__(self, settings: ApplySettings, devices: Iterable[Device], journal: CapJournal, *,
                 verdicts: Callable[[], Iterable[Verdict]] | None = None,
                 idle: Callable[[int], bool] | None = None,
                 metrics: ApplyMetrics | None = None,
                 held_caps: dict[int, float] | None = None,
                 on_cap_change: Callable[[int], None] | None = None,
                 busy_now: Callable[[Device], str | None] | None = None,
                 turns: GpuTurns | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.devices = {d.index: d for d in devices}
        self.journal = journal
        self.verdicts = verdicts
        self.idle = idle
        self.metrics = metrics
        #: Shared with the probe service: the operator's cap of each GPU holding an applied cap.
        self.held_caps = held_caps if held_caps is not None else {}
        self.on_cap_change = on_cap_change
        #: Read live at the moment of a write, under the GPU's lock: why a user's job holds the GPU now
        #: (a foreign compute process, a pod's allocation), or None. The idle tracker's window alone
        #: lags a job that just started (issue 51).
        self.busy_now = busy_now
        #: The daemon's GPU turns (the probe service's): a change waits for the GPU's turn in line with
        #: the rounds. None (no daemon): the cap lock alone guards a change.
        self.turns = turns
        self.clock = clock
        self.book = PointBook()
        self.states = {index: GpuApply() for index in self.devices}
        self._pass = threading.Lock()
        #: Callers other than the passes' thread waiting for ``_pass`` (a reload, a stop): a pass
        #: waiting for GPU turns gives up its wait for them.
        self._callers = 0
        self._callers_lock = threading.Lock()
        #: True while a pass looks without the cap lock (under ``_pass``): a cap change raises _ChangeDue.
        self._looking = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.interval_seconds = 30.0
        if metrics is not None:
            metrics.set_mode(settings.mode, self._workload())

    def refusals(self, settings: ApplySettings) -> list[str]:
        """What in ``settings`` cannot work on this node's GPUs (a canary GPU it does not have): the
        daemon refuses to start with it, and a reload with it keeps the running configuration."""
        if settings.mode == "off" or settings.canary_gpus is None:
            return []
        missing = sorted(set(settings.canary_gpus) - set(self.devices))
        if not missing:
            return []
        return [f"apply.canary_gpus: GPU {', '.join(map(str, missing))} does not exist on this node "
                f"(its GPUs: {', '.join(map(str, sorted(self.devices))) or 'none'})"]

    def canary_note(self, settings: ApplySettings | None = None) -> str | None:
        """A warning, with the numbers, when canary mode picks none of this node's GPUs."""
        settings = settings or self.settings
        if settings.mode != "canary":
            return None
        picked = []
        for index, device in self.devices.items():
            try:
                if in_canary(index, device.info().uuid, settings):
                    picked.append(index)
            except DeviceError:
                continue
        if picked:
            return None
        how = (f"canary_gpus {list(settings.canary_gpus)}" if settings.canary_gpus is not None
               else f"canary_share {settings.canary_share:g} (a hash of each GPU's UUID below the share)")
        return (f"apply canary: {how} picks none of this node's {len(self.devices)} GPU(s), so no cap is applied "
                f"here; name them in apply.canary_gpus or raise apply.canary_share")

    def _workload(self) -> str:
        s = self.settings
        return f"{s.probe}/{s.preset}" if s.preset else s.probe

    # --- inputs ------------------------------------------------------------------------------

    def observe(self, gpu: int, probe: str, preset: str, point: SweepPoint) -> None:
        """The probe service's point listener: keeps the workload's points."""
        if self.settings.wants(probe, preset):
            self.book.observe(gpu, point)

    def _verdict(self, index: int) -> tuple[str, tuple[str, ...]]:
        if self.verdicts is None:
            return "unknown", ("health verdicts are off",)
        for verdict in self.verdicts():
            if verdict.gpu == index:
                return verdict.state, tuple(sorted({r.check for r in verdict.reasons}))
        return "unknown", ("no verdict yet",)

    def _facts(self, device: Device, uuid: str, limits: PowerLimits | None, operator: float) -> GpuFacts:
        state, checks = self._verdict(device.index)
        idle = True if self.idle is None else self.idle(device.index)
        return GpuFacts(device.index, uuid, limits, operator, self.book.of(device.index), state, checks, idle,
                        self.clock())

    # --- the pass ----------------------------------------------------------------------------

    def tick(self) -> None:
        """One pass over every GPU; a GPU's failure is logged and is that GPU's alone. GPUs with a change
        due are changed under their turns (:meth:`_in_turns`)."""
        with self._pass:
            started = time.monotonic()
            due: dict[int, tuple[str, GpuLock]] = {}
            for device in self.devices.values():
                try:
                    found = self._step(device)
                except Exception:  # noqa: BLE001 - one GPU's bug must not stop the others
                    log.exception("gpu %d: apply pass failed", device.index)
                    continue
                if found is not None and self.turns is None:  # no daemon: the cap lock alone
                    self._change_logged(device.index, *found)
                elif found is not None:
                    due[device.index] = found
            if due:
                self._in_turns(due, started + self.interval_seconds)

    def _in_turns(self, due: dict[int, tuple[str, GpuLock]], deadline: float) -> None:
        """Each GPU of ``due`` changed under its turn, waiting in line (arrival order) with the rounds and
        interconnect runs: a GPU a round holds is changed as soon as the round gives it back, ahead of any
        round that came later. All the GPUs wait at once, so a held GPU never holds up a free one, and
        the wait ends when the next pass is due (``deadline``: the pass's start plus ``interval_seconds``;
        a reload or a stop ends it at once): a change that becomes due on another GPU meanwhile waits no
        longer than it would between passes, and the holder's release wakes the next pass anyway."""
        assert self.turns is not None
        left = self.turns.take_each(sorted(due), PASS_HOLDER, deadline - time.monotonic(),
                                    lambda index: self._change_logged(index, *due[index]), self._give_way)
        for index in left:
            holder = self.turns.holder(index)
            log.debug("gpu %d: apply change waits for the GPU's turn (held by %s); the next pass looks again",
                      index, holder.name if holder is not None else "-")
            self._not_now(index, due[index][0], self.states[index])

    def _give_way(self) -> bool:
        """True when a pass waiting for turns must stop waiting: the controller stops, or a reload or a
        stop waits for the pass."""
        return self._stop.is_set() or self._callers > 0

    def _step(self, device: Device) -> tuple[str, GpuLock] | None:
        """The look at one GPU, without its turn or cap lock. Returns its UUID and cap lock when a change
        is due or the look could not tell (a writer holds the lock): decided again under both."""
        try:
            uuid = device.info().uuid
        except DeviceError as exc:
            log.debug("gpu %d: apply skipped: %s", device.index, exc)
            return None
        state = self.states[device.index]
        lock = self.journal.lock(safe_name(uuid))
        if lock.owner() is None:  # nobody writes the cap now: look first, turn and lock only for a change
            try:
                if self._look(device, uuid, state, lock):
                    self._publish(device.index, uuid, state)
                    return None
            except DeviceError as exc:  # a lost or failing GPU: an applied cap stays journaled for the next start
                log.warning("gpu %d: apply pass: %s", device.index, exc)
                self._publish(device.index, uuid, state)
                return None
        elif self.settings.mode in ("off", "advise") and state.applied_watts is None:
            self._not_now(device.index, uuid, state)  # these modes change no cap: no turn to wait for
            return None
        return uuid, lock

    def _change_logged(self, index: int, uuid: str, lock: GpuLock) -> bool:
        """:meth:`_change`, its failure logged as that GPU's alone; True: the cap may have changed."""
        try:
            self._change(self.devices[index], uuid, lock)
        except Exception:  # noqa: BLE001 - one GPU's bug must not stop the others
            log.exception("gpu %d: apply pass failed", index)
        return True

    def _not_now(self, index: int, uuid: str, state: GpuApply) -> None:
        """A change that cannot be made now (a writer holds the GPU): the next pass looks again, and the
        state so far stays on /metrics meanwhile, with what the writer's sweep measured."""
        self._publish(index, uuid, state)
        if state.applied_watts is not None and not state.overridden:
            self._publish_realized(index, uuid, state, self.book.of(index))

    def _change(self, device: Device, uuid: str, lock: GpuLock) -> None:
        """Under the GPU's turn (in the daemon): take the cap lock, decide again and change. A lock held
        now is another process's (a CLI sweep; the daemon's own writers hold the turn)."""
        state = self.states[device.index]
        try:
            lock.acquire()
        except GpuBusy:  # a sweep or a CLI run owns the cap now; the next pass looks again
            self._not_now(device.index, uuid, state)
            return
        except OSError as exc:
            log.warning("gpu %d: apply cannot lock the cap in %s: %s", device.index, self.journal.state_dir, exc)
            return
        try:
            if state.applied_watts is not None:
                self._watch(device, uuid, state)
            else:
                self._consider(device, uuid, state)
        except DeviceError as exc:  # a lost or failing GPU: an applied cap stays journaled for the next start
            log.warning("gpu %d: apply pass: %s", device.index, exc)
        finally:
            lock.release()
        self._publish(device.index, uuid, state)

    def _look(self, device: Device, uuid: str, state: GpuApply, lock: GpuLock) -> bool:
        """The pass without the cap lock, on a copy of the GPU's state: True (the copy kept) when it changes
        no cap; False when a change is due, or a writer took the cap meanwhile (what was read may be its
        sweep's): the pass then takes the lock and decides again under it."""
        look = dataclasses.replace(state)
        self._looking = True
        try:
            if look.applied_watts is not None:
                self._watch(device, uuid, look)
            else:
                self._consider(device, uuid, look)
        except _ChangeDue:
            return False
        finally:
            self._looking = False
        if lock.owner() is not None:
            return False
        for name in (f.name for f in dataclasses.fields(GpuApply)):
            setattr(state, name, getattr(look, name))
        return True

    def _changing(self) -> None:
        """Called before any cap or journal change: a look stops here (the change needs the cap lock)."""
        if self._looking:
            raise _ChangeDue()

    def _limits(self, device: Device) -> PowerLimits | None:
        try:
            return device.power_limits()
        except DeviceError as exc:
            if exc.reason != "not_supported":
                raise
            return None

    def _consider(self, device: Device, uuid: str, state: GpuApply) -> None:
        if self.settings.mode in ("canary", "on") and self._held_by_operator(device.index, uuid, state):
            return
        if state.out:
            return
        limits = self._limits(device)
        operator = limits.enforced_watts if limits is not None else 0.0
        if self.settings.mode not in ("off", "advise"):
            self._restore_dead_writers(device, uuid)
        other = self._entry_elsewhere(uuid) if self.settings.mode not in ("off", "advise") else None
        if other is not None:  # another writer's cap (a second daemon's, a dead sweep's): never the operator's
            entry, where = other
            state.advised_watts = None
            detail = (f"the cap journal in {where} holds this GPU (pid {entry.pid}, operator's "
                      f"{entry.original_watts:.0f} W): not applied while another writer's entry stands")
            if (state.reason, state.detail) != ("held_elsewhere", detail):
                log.info("gpu %d: apply held_elsewhere: %s", device.index, detail)
            state.reason, state.detail = "held_elsewhere", detail
            return
        decision = decide(self.settings, self._facts(device, uuid, limits, operator))
        state.advised_watts = decision.cap_watts
        if decision.apply and limits is not None and decision.cap_watts is not None:
            if (busy := self._busy_at_write(device)) is not None:
                decision = type(decision)(decision.cap_watts, "busy", f"{busy}; applied once idle (allow_busy: false)")
            else:
                self._apply(device, uuid, state, decision.cap_watts, limits, decision.detail)
                return
        if (state.reason, state.detail) != (decision.reason, decision.detail) and decision.reason != "off":
            log.info("gpu %d: apply %s: %s", device.index, decision.reason, decision.detail or "-")
        state.reason, state.detail = decision.reason, decision.detail

    def _held_by_operator(self, index: int, uuid: str, state: GpuApply) -> bool:
        """True while an operator holds the GPU (holds.py: their cap, kept across restarts and reloads);
        a hold given back (``apply --release``) lets the GPU into apply mode again at once."""
        hold = hold_of(self._hold_dirs(), uuid)
        if hold is None:
            if state.held_since is not None:
                log.warning("gpu %d: given back by the operator: apply mode may set its cap again", index)
                state.held_since, state.out, state.overridden = None, False, False
            return False
        overridden = hold.kind == "overridden"  # else the operator's own cap set back: quiet, as when it left
        detail = (f"{'' if overridden else 'reverted: '}the operator's {hold.watts:.0f} W since {hold.since_text()}: "
                  f"held until given back (gpuperfd apply --release {index}, or POST /api/v1/apply/release?gpu={index})")
        if state.held_since != hold.since:
            log.warning("gpu %d: %s; apply mode leaves this GPU", index, detail)
        state.held_since, state.out, state.overridden = hold.since, True, overridden
        state.reason, state.detail, state.advised_watts = "overridden" if overridden else "rolled_back", detail, None
        return True

    def _hold_dirs(self) -> list[Path]:
        """Where operator holds are kept: this state directory, then every other one of the node's registry."""
        return [self.journal.state_dir, *(journal.state_dir for journal in self._journals())]

    def _hold(self, device: Device, uuid: str, state: GpuApply, watts: float, detail: str) -> None:
        """Keep the operator's cap (holds.py) so that no restart or reload applies over it; ``detail``
        starts with its kind (``overridden:`` or ``reverted:``)."""
        hold = OperatorHold(uuid, device.index, watts, self.clock(), detail, detail.split(":", 1)[0])
        write_hold(self.journal.state_dir, hold)
        state.held_since = hold.since

    def release(self, index: int) -> OperatorHold:
        """Give GPU ``index`` back to apply mode (the API's release; the command removes the same hold).
        ReleaseError naming what was wrong: no such GPU on this node, or no operator holds it."""
        hold = release_hold(self._hold_dirs(), list(self.devices.values()), index)
        self._wake.set()  # the next pass takes the GPU now, not in interval_seconds
        return hold

    def _busy_at_write(self, device: Device) -> str | None:
        """Why a user's job holds the GPU now (read live, under the GPU's lock), unless allow_busy."""
        if self.settings.allow_busy or self.busy_now is None:
            return None
        return self.busy_now(device)

    def _journals(self) -> list[CapJournal]:
        """Every other state directory of this node's registry (where another writer may journal)."""
        if self.journal.registry is None:
            return []
        mine = self.journal.state_dir.resolve()
        return [CapJournal(d, self.journal.registry) for d in read_registry(self.journal.registry)
                if d.is_dir() and d.resolve() != mine]

    def _restore_dead_writers(self, device: Device, uuid: str) -> None:
        """Put back, now, a cap a writer of ours that died left on this GPU (a SIGKILLed ``gpuperfd sweep``,
        in this or another state directory), by the one rule (only over a cap it set), instead of leaving it
        on the board until the next sweep of the GPU. Entries a live writer or daemon holds are left to it."""
        name = safe_name(uuid)
        for journal in [self.journal, *self._journals()]:
            entry = journal.entry(uuid)
            if entry is None or entry.writer_alive() or is_owned(journal.state_dir, apply_lock_name(name)) is not None:
                continue
            self._changing()
            mine = journal is self.journal  # this directory's GPU lock is ours now
            done = restore_pending(journal, [device], only=[uuid], lock=not mine)
            if done:
                log.warning("gpu %d: a writer of ours (pid %d) died with its cap journaled in %s: %s",
                            device.index, entry.pid, journal.state_dir, "; ".join(done))
                self._cap_changed(device.index)

    def _entry_elsewhere(self, uuid: str) -> tuple[CapRecord, str] | None:
        """An entry of this GPU that is not this controller's: in its own journal (a second daemon's
        applied cap, a writer's leftover) or in another state directory of the node."""
        for journal in [self.journal, *self._journals()]:
            entry = journal.entry(uuid)
            if entry is not None:
                return entry, str(journal.state_dir)
        return None

    def _whose(self, uuid: str, enforced: float, entry: CapRecord | None) -> str:
        """Whose cap the board reads, where it is not the applied one: ``writer`` (a writer of ours
        that died around its write: restored), ``live`` (a writer of ours works on it now: wait),
        ``revert`` (the operator's own cap is back) or ``operator`` (someone else set it: it stays)."""
        watts = round(enforced)
        if entry is not None and watts == round(entry.original_watts):
            return "revert"  # the operator's own cap (a writer that died writing it left it too: the same cap)
        if entry is not None and entry.knows_its_writes() and watts in entry.ours():
            return "writer"  # we hold this directory's GPU lock: its writer is gone (or it was our own sweep)
        name = safe_name(uuid)
        for journal in self._journals():
            other = journal.entry(uuid)
            if other is None or not other.knows_its_writes() or watts not in other.ours():
                continue
            if (other.writer_alive() or is_owned(journal.state_dir, name) is not None
                    or is_owned(journal.state_dir, apply_lock_name(name)) is not None):
                return "live"
            return "writer"
        return "operator"

    def _a_writer_may_have_left(self, uuid: str, watts: float, entry: CapRecord) -> bool:
        """Whether another process of ours (a CLI sweep, in this or another state directory) journaled a
        write of ``watts`` last: the operator's own cap on the board may then be its leftover, not a
        word of the operator's to keep (a hold is written only where nothing of ours could have set it)."""
        if entry.pid != os.getpid() and round(watts) in entry.ours():
            return True
        others = (journal.entry(uuid) for journal in self._journals())
        return any(other is not None and round(watts) in other.ours() for other in others)

    def _apply(self, device: Device, uuid: str, state: GpuApply, cap: float, limits: PowerLimits, why: str) -> None:
        """Journal the operator's cap, hold the apply lock, set ``cap`` and read it back (or undo it)."""
        self._changing()
        hold = GpuLock(self.journal.state_dir, apply_lock_name(safe_name(uuid)))
        try:
            hold.acquire()
            operator = self.journal.record(device, limits.enforced_watts, limits.default_watts,
                                           applied_watts=cap).original_watts
        except (GpuBusy, JournalWriteError, OSError) as exc:
            hold.release()
            log.error("gpu %d: not applying %.0f W: %s", device.index, cap, exc)
            state.reason, state.detail, state.out = "rolled_back", f"not applied: {exc}", True
            return
        state.hold, state.operator_watts = hold, operator
        try:
            now = device.power_limits().enforced_watts  # right before the write (after the journal's fsync)
            if round(now) != round(limits.enforced_watts):  # changed by hand meanwhile: theirs, nothing written
                self.journal.clear(uuid)
                self._release(device.index, uuid, state)
                log.warning("gpu %d: the cap changed to %.0f W while %.0f W was being applied: not applied; the "
                            "next pass looks again", device.index, now, cap)
                return
            device.set_power_limit(cap)
            back = device.power_limits().enforced_watts
        except DeviceError as exc:
            state.applied_watts = cap
            if self._unchanged(device, operator):  # refused: nothing to put back, the entry goes
                self.journal.clear(uuid)
                self._release(device.index, uuid, state)
                reason = "not_supported" if exc.reason == "not_supported" else "rolled_back"
                state.reason, state.detail, state.out = reason, f"failed_to_apply: setting {cap:.0f} W: {exc}", True
                log.error("gpu %d: not applied: setting %.0f W failed: %s", device.index, cap, exc)
                return
            self._rollback(device, uuid, state, "failed_to_apply", f"setting {cap:.0f} W failed: {exc}")
            return
        if round(back) != round(cap):
            state.applied_watts = cap
            self._rollback(device, uuid, state, "failed_to_apply", f"{cap:.0f} W set but reads back {back:.0f} W")
            return
        state.applied_watts, state.applied_at = cap, self.clock()
        state.reason, state.detail = "applied", why
        self.held_caps[device.index] = operator
        log.warning("gpu %d: applied power cap %.0f W (operator's %.0f W journaled): %s",
                    device.index, cap, operator, why)
        self._cap_changed(device.index)

    @staticmethod
    def _unchanged(device: Device, watts: float) -> bool:
        try:
            return round(device.power_limits().enforced_watts) == round(watts)
        except DeviceError:
            return False

    def _watch(self, device: Device, uuid: str, state: GpuApply) -> None:
        assert state.applied_watts is not None and state.operator_watts is not None
        limits = device.power_limits()
        enforced = limits.enforced_watts
        entry = self.journal.entry(uuid)
        if entry is None or entry.applied_watts is None:  # apply mode's entry was taken away (a revert, a
            if round(enforced) == round(state.operator_watts):  # sweep that found an operator's cap)
                self._reverted(device, uuid, state, f"the operator's {state.operator_watts:.0f} W is back "
                                                    "and the journal entry was removed (gpuperfd apply --revert)")
            else:
                self._leave(device, uuid, state, f"the cap reads {enforced:.0f} W, not the applied "
                                                 f"{state.applied_watts:.0f} W, and the journal entry was removed")
            return
        left_by_sweep = False  # a cap a writer of ours left (a sweep that could not put the applied cap back)
        if round(enforced) != round(state.applied_watts):  # is told by the journal's last pair (_whose), which
            whose = self._whose(uuid, enforced, entry)      # every writer, in this process or another, writes first
            if whose == "live":
                log.info("gpu %d: the cap reads %.0f W, set by a writer of ours that runs now; looked at again "
                         "in the next pass", device.index, enforced)
                return
            if whose == "revert":
                self._reverted(device, uuid, state, f"the cap reads the operator's {enforced:.0f} W again "
                                                    f"(set by hand)", held=not self._a_writer_may_have_left(
                                                        uuid, enforced, entry))
                return
            left_by_sweep = whose == "writer"
        facts = self._facts(device, uuid, limits, state.operator_watts)
        why = check_applied(self.settings, facts, state.applied_watts, state.applied_at, enforced,
                            sweep_unrestored=left_by_sweep)
        if why is None and (busy := self._busy_at_write(device)) is not None:
            why = ("busy", f"{busy} (allow_busy: false)")
        if why is None:
            self._publish_realized(device.index, uuid, state, facts.points)
            return
        if why[0] == "overridden":
            self._leave(device, uuid, state, why[1])
        else:
            self._rollback(device, uuid, state, *why)

    def _publish_realized(self, index: int, uuid: str, state: GpuApply, points: Sequence[SweepPoint]) -> None:
        """The savings measured at the applied cap against the operator's (pure: from the points seen)."""
        if self.metrics is None or state.applied_watts is None or state.operator_watts is None:
            return
        saved = realized(points, state.applied_watts, state.operator_watts, state.applied_at)
        self.metrics.set_realized(index, uuid, self.settings.probe, self.settings.preset or self._preset_of(points),
                                  saved)

    @staticmethod
    def _preset_of(points: Iterable[SweepPoint]) -> str:
        return next((p.result.preset for p in points), "")

    def _rollback(self, device: Device, uuid: str, state: GpuApply, reason: str, detail: str) -> bool:
        """Put the operator's cap back by the one rule (:func:`put_back`: only over a cap of ours), read
        it back, clear the journal; False (journal kept) if it does not read back. A cap that is not
        ours is the operator's: it stays and the GPU leaves apply mode (overridden)."""
        self._changing()
        operator = state.operator_watts
        assert operator is not None
        entry = self.journal.entry(uuid)
        ours = {round(state.applied_watts or operator)} | (entry.ours() if entry is not None else set())
        for journal in self._journals():  # a dead writer's cap in another state directory is ours too
            other = journal.entry(uuid)
            if other is not None and other.knows_its_writes() and not other.writer_alive():
                ours |= other.ours()
        try:
            done = put_back(self.journal, device, uuid, operator, ours, f"apply rollback ({reason})")
        except DeviceError as exc:
            log.error("gpu %d: rolling back to %.0f W failed (%s); the journal keeps it for the next start",
                      device.index, operator, exc)
            return False
        if done.theirs:
            self._leave(device, uuid, state, f"the cap reads {done.found:.0f} W, not one apply set "
                                             f"(at {reason}: {detail})")
            return False
        self.journal.clear(uuid)
        log.warning("gpu %d: applied cap %.0f W rolled back to the operator's %.0f W (%s): %s",
                    device.index, state.applied_watts or 0.0, operator, reason, detail)
        self._release(device.index, uuid, state)
        # a user's job came: applied again once idle (as a GPU held back as busy); any other reason: out
        state.reason, state.detail, state.out = "rolled_back", f"{reason}: {detail}", reason != "busy"
        if self.metrics is not None:
            self.metrics.rolled_back(device.index, uuid, reason)
        self._cap_changed(device.index)
        return True

    def _reverted(self, device: Device, uuid: str, state: GpuApply, detail: str, held: bool = False) -> None:
        """The operator's own cap is back (``apply --revert``, or by hand): apply mode's work is undone by
        the operator, so the GPU leaves apply mode quietly (no override alert, no rollback counted).
        ``held`` (set by hand): the operator's word, kept until they give the GPU back (holds.py)."""
        self._changing()
        operator = state.operator_watts or 0.0
        self.journal.clear(uuid)
        self.journal.believe(uuid, "operator", operator, f"reverted: {detail}")
        log.warning("gpu %d: %s; this GPU leaves apply mode%s", device.index, detail,
                    f" until the operator gives it back (gpuperfd apply --release {device.index})" if held else "")
        self._release(device.index, uuid, state)
        if held:
            self._hold(device, uuid, state, operator, f"reverted: {detail}")
        state.out, state.reason, state.detail = True, "rolled_back", f"reverted: {detail}"
        self._cap_changed(device.index)

    def _leave(self, device: Device, uuid: str, state: GpuApply, detail: str) -> None:
        """Someone else set a cap: never fight it. The journal entry goes *without* a restore (a later
        start must not put the old cap over their choice), and the GPU leaves apply mode."""
        self._changing()
        self.journal.clear(uuid)
        try:
            found = device.power_limits().enforced_watts
        except DeviceError:
            found = 0.0
        self.journal.believe(uuid, "operator", found, f"overridden: {detail}")
        log.warning("gpu %d: %s; someone else changed the cap: leaving it, this GPU leaves apply mode until the "
                    "operator gives it back (gpuperfd apply --release %d)", device.index, detail, device.index)
        self._release(device.index, uuid, state)
        self._hold(device, uuid, state, found, f"overridden: {detail}")
        state.overridden, state.out, state.reason, state.detail = True, True, "overridden", detail

    def _release(self, index: int, uuid: str, state: GpuApply) -> None:
        if state.hold is not None:
            state.hold.release()
        state.hold, state.applied_watts, state.operator_watts = None, None, None
        self.held_caps.pop(index, None)
        if self.metrics is not None:
            self.metrics.clear_realized(index, uuid)

    def _cap_changed(self, index: int) -> None:
        if self.on_cap_change is not None:
            self.on_cap_change(index)

    def _publish(self, index: int, uuid: str, state: GpuApply) -> None:
        if self.metrics is None:
            return
        advised = state.applied_watts if state.applied_watts is not None else state.advised_watts
        if state.reason not in OUT_OF_SCOPE:  # a GPU whose cap apply may change: its rollback counters from 0
            self.metrics.declare_rollbacks(index, uuid)
        self.metrics.set_state(index, uuid, state.reason, advised)
        self.metrics.set_applied(index, uuid, state.applied_watts, state.operator_watts)
        self.metrics.set_overridden(index, uuid, state.overridden)

    # --- mode changes, revert, the thread ----------------------------------------------------

    def configure(self, settings: ApplySettings) -> list[str]:
        """Take a (re)loaded ``apply:`` section. A GPU no longer allowed to hold its cap (mode off or
        advise, out of the canary, another workload or budget) gets the operator's cap back; a new
        mode or workload lets GPUs that left apply mode try again. Returns what was rolled back."""
        with self._pass_for_caller():  # never beside a pass of the controller's thread
            return self._configure(settings)

    @contextmanager
    def _pass_for_caller(self) -> Iterator[None]:
        """The pass lock for a caller other than the passes' thread (a reload, a stop): a pass waiting for
        GPU turns stops waiting at once (its GPUs are looked at again in the next pass), so the caller
        never waits out a round."""
        with self._callers_lock:
            self._callers += 1
        try:
            if self.turns is not None:
                self.turns.nudge()  # the waiting pass reads _give_way now
            with self._pass:
                yield
        finally:
            with self._callers_lock:
                self._callers -= 1

    def _configure(self, settings: ApplySettings) -> list[str]:
        if (note := self.canary_note(settings)) is not None:
            log.warning("%s", note)
        before, self.settings = self.settings, settings
        fresh = (before.mode, before.probe, before.preset) != (settings.mode, settings.probe, settings.preset)
        if (before.probe, before.preset) != (settings.probe, settings.preset):
            self.book.clear()
        if self.metrics is not None:
            self.metrics.set_mode(settings.mode, self._workload())
        done: list[str] = []
        for index, state in self.states.items():
            if state.applied_watts is not None and not self._still_allowed(index, before, settings):
                done += self._revert_one(index, "mode", f"apply mode {settings.mode} ({self._workload() or '-'})")
            if fresh or before.canary_gpus != settings.canary_gpus or before.canary_share != settings.canary_share:
                state.out = state.overridden = False
        return done

    def _still_allowed(self, index: int, before: ApplySettings, now: ApplySettings) -> bool:
        if now.mode not in ("canary", "on") or (before.probe, before.preset) != (now.probe, now.preset):
            return False
        if now.budget_ratio < before.budget_ratio:
            return False  # a tighter budget: the cap was chosen under the looser one
        if now.mode == "canary":
            try:
                uuid = self.devices[index].info().uuid
            except DeviceError:
                return False
            return in_canary(index, uuid, now)
        return True

    def _revert_one(self, index: int, reason: str, detail: str, wait_seconds: float = 5.0) -> list[str]:
        """The operator's cap back on one GPU, under its turn (in the daemon: a round running on it is
        waited for up to ``wait_seconds``) and its cap lock."""
        device = self.devices[index]
        try:
            uuid = device.info().uuid
        except DeviceError as exc:
            return [f"gpu {index}: cannot read it ({exc}); the journal restores it at the next start"]
        if self.turns is None:
            return self._revert_locked(index, uuid, reason, detail, wait_seconds)
        if self.turns.take(index, REVERT_HOLDER, wait_seconds) is not Turn.GRANTED:
            holder = self.turns.holder(index)
            return [f"gpu {index}: not reverted now ({holder.kind.value if holder is not None else 'another'} "
                    f"holds the GPU); the journal keeps the operator's cap"]
        try:
            return self._revert_locked(index, uuid, reason, detail, wait_seconds)
        finally:
            self.turns.release(index, wrote=True)

    def _revert_locked(self, index: int, uuid: str, reason: str, detail: str, wait_seconds: float) -> list[str]:
        """:meth:`_revert_one` under the GPU's cap lock (another process's sweep is waited for)."""
        device, state = self.devices[index], self.states[index]
        lock = self.journal.lock(safe_name(uuid))
        try:
            lock.acquire(wait_seconds=wait_seconds)  # another process's (a CLI sweep, a check): waited for
        except (GpuBusy, OSError) as exc:
            return [f"gpu {index}: not reverted now ({exc}); the journal keeps the operator's cap"]
        try:
            if state.applied_watts is None:
                return []
            operator = state.operator_watts
            ok = self._rollback(device, uuid, state, reason, detail)
        finally:
            lock.release()
        self._publish(index, uuid, state)
        return [f"gpu {index}: operator's cap {operator:.0f} W back" if ok
                else f"gpu {index}: NOT restored; the journal keeps the operator's cap"]

    def revert_all(self, reason: str = "stopped", detail: str = "gpuperfd stops") -> list[str]:
        """Every applied cap back to the operator's (daemon stop, mode off), verified by reading back."""
        with self._pass_for_caller():
            done: list[str] = []
            for index, state in self.states.items():
                if state.applied_watts is not None:
                    done += self._revert_one(index, reason, detail)
            return done

    def status(self) -> list[dict[str, object]]:
        """Each GPU's apply state, for logs and the landing page."""
        return [{"gpu": index, "reason": s.reason, "detail": s.detail, "applied_watts": s.applied_watts,
                 "advised_watts": s.advised_watts, "operator_watts": s.operator_watts, "overridden": s.overridden,
                 "held_by_operator_since": s.held_since}
                for index, s in sorted(self.states.items())]

    def start(self, interval_seconds: float) -> None:
        """Passes every ``interval_seconds`` on a daemon thread (nothing runs in mode off)."""
        self.interval_seconds = interval_seconds
        self._thread = threading.Thread(target=self._run, name="gpuperfd-apply", daemon=True)
        self._thread.start()

    def gpu_released(self, done: Release) -> None:
        """The GPU turns' listener (:class:`~gpuperfd.probing.gates.turns.GpuTurns`): a round or an
        interconnect run that held the GPU's cap lock gave the GPU back. The next pass runs now: what
        the holder left is judged at once, not up to ``interval_seconds`` later. Apply mode's own
        releases wake nothing (its pass already judged the GPU)."""
        if done.wrote and done.holder.kind is not HolderKind.APPLY:
            self._wake.set()

    def _run(self) -> None:
        """A pass every ``interval_seconds`` from the last one's start (a pass that waited for turns
        does not push the next one back), or at once when woken."""
        started = time.monotonic()
        while not self._stop.is_set():
            self._wake.wait(max(0.0, self.interval_seconds - (time.monotonic() - started)))
            self._wake.clear()
            started = time.monotonic()
            if not self._stop.is_set() and self.settings.mode != "off":
                self.tick()

    def stop(self) -> list[str]:
        """Stop the passes and give every applied cap back (the operator's cap, read back)."""
        self._stop.set()
        self._wake.set()
        if self.turns is not None:
            self.turns.nudge()  # a pass waiting for turns stops waiting
        if self._thread is not None:
            self._thread.join(timeout=self.interval_seconds + 10)
        done = self.revert_all()
        for state in self.states.values():  # one not reverted now: the daemon's journal pass at stop restores it
            if state.hold is not None:
                state.hold.release()
                state.hold = None
        return done
