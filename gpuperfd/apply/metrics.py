"""The apply series (docs/apply.md, docs/metrics.md "Apply"): one small registry beside the probe series.

Per GPU at most one ``gpuperf_apply_state`` series (its current reason), the applied, advised and
operator caps while they exist, a rollback counter by bounded reason, and the realized savings of
the workload's probe at the applied cap against the operator's cap. Labels are bounded: ``reason``
from :data:`gpuperfd.apply.policy.HOLD_REASONS` / ``ROLLBACK_REASONS``, one workload per node.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuperfd.apply.policy import ROLLBACK_REASONS, Realized

GPU_LABELS = ("gpu", "uuid")
WORKLOAD_LABELS = ("gpu", "uuid", "probe", "preset")


def _changes(method: Callable[..., bool]) -> Callable[..., None]:
    """A setter that says whether a series changed: the version moves only then (an unchanged pass renders
    nothing), and after the change, so a scrape in between never caches the old text under the new version."""
    @functools.wraps(method)
    def wrapper(self: ApplyMetrics, *args: Any, **kwargs: Any) -> None:
        with self._write:
            changed = method(self, *args, **kwargs)
            if changed:
                self._changed()

    return wrapper


class ApplyMetrics:
    """Gauges and counters of the apply controller, in their own registry (re-rendered when :meth:`version` moves)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.info = Gauge("gpuperf_apply_info", "Apply mode (off, advise, canary, on) and the workload it serves; 1.",
                          ("mode", "workload"), registry=r)
        self.state = Gauge("gpuperf_apply_state", "1 for the reason a GPU holds (applied) or does not hold an applied cap.",
                           (*GPU_LABELS, "reason"), registry=r)
        self.applied = Gauge("gpuperf_apply_cap_watts", "The power cap apply mode holds on the GPU, watts (absent: none).",
                             GPU_LABELS, registry=r)
        self.advised = Gauge("gpuperf_apply_advised_cap_watts",
                             "The cap apply would set (advise) or holds, from the recommendation within the budget, watts.",
                             GPU_LABELS, registry=r)
        self.operator = Gauge("gpuperf_apply_operator_cap_watts",
                              "The operator's own cap, journaled before the applied one and restored on rollback, watts.",
                              GPU_LABELS, registry=r)
        self.overridden = Gauge("gpuperf_apply_overridden",
                                "1 when someone else changed a cap apply had set: the GPU left apply mode, their cap stands "
                                "until the operator gives the GPU back (gpuperfd apply --release).",
                                GPU_LABELS, registry=r)
        self.rollbacks = Counter("gpuperf_apply_rollbacks", "Applied caps given back to the operator's cap, by reason.",
                                 (*GPU_LABELS, "reason"), registry=r)
        self.power_saved = Gauge("gpuperf_apply_realized_power_saved_watts",
                                 "Measured: the workload probe's average power at the operator's cap minus at the applied cap, watts.",
                                 WORKLOAD_LABELS, registry=r)
        self.energy_saving = Gauge("gpuperf_apply_realized_energy_saving_ratio",
                                   "Measured: 1 - energy per unit at the applied cap / at the operator's cap.",
                                   WORKLOAD_LABELS, registry=r)
        self.throughput_loss = Gauge("gpuperf_apply_realized_throughput_loss_ratio",
                                     "Measured: 1 - throughput at the applied cap / at the operator's cap.",
                                     WORKLOAD_LABELS, registry=r)
        self._reasons: dict[tuple[str, str], str] = {}
        #: What each gauge shows now, by (gauge, labels): a setter compares before it writes.
        self._shown: dict[tuple[Gauge, tuple[str, ...]], float] = {}
        self._mode: tuple[str, str] | None = None
        self._declared: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._write = threading.RLock()  # one setter at a time: compare and write as one step
        self._version = 0

    def version(self) -> int:
        """Changes whenever a series changes (and only then), so the scrape path re-renders this registry
        only then."""
        return self._version

    def _changed(self) -> None:
        with self._lock:
            self._version += 1

    @_changes
    def set_mode(self, mode: str, workload: str) -> bool:
        if self._mode == (mode, workload):
            return False
        self.info.clear()
        self.info.labels(mode, workload).set(1)
        self._mode = (mode, workload)
        return True

    @_changes
    def set_state(self, gpu: int, uuid: str, reason: str, advised: float | None) -> bool:
        """The GPU's one state series (the old reason's series goes) and its advised cap."""
        key = (str(gpu), uuid)
        before = self._reasons.get(key)
        changed = before != reason
        if changed:
            if before is not None:
                self.state.remove(*key, before)
            self._reasons[key] = reason
            self.state.labels(*key, reason).set(1)
        return self._put(self.advised, key, advised) or changed

    @_changes
    def set_applied(self, gpu: int, uuid: str, cap: float | None, operator: float | None) -> bool:
        key = (str(gpu), uuid)
        return self._put(self.applied, key, cap) | self._put(self.operator, key, operator)

    @_changes
    def set_overridden(self, gpu: int, uuid: str, value: bool) -> bool:
        return self._put(self.overridden, (str(gpu), uuid), 1 if value else 0)

    @_changes
    def declare_rollbacks(self, gpu: int, uuid: str) -> bool:
        """Every rollback reason's counter from 0 for a GPU apply may change, so ``increase()`` has data
        (and a dashboard a zero) before the first rollback; bounded by ROLLBACK_REASONS."""
        if (str(gpu), uuid) in self._declared:
            return False
        for reason in ROLLBACK_REASONS:
            self.rollbacks.labels(str(gpu), uuid, reason)
        self._declared.add((str(gpu), uuid))
        return True

    @_changes
    def rolled_back(self, gpu: int, uuid: str, reason: str) -> bool:
        self.rollbacks.labels(str(gpu), uuid, reason).inc()
        return True

    @_changes
    def set_realized(self, gpu: int, uuid: str, probe: str, preset: str, saved: Realized | None) -> bool:
        key = (str(gpu), uuid, probe, preset)
        changed = False
        for gauge, value in ((self.power_saved, None if saved is None else saved.power_saved_watts),
                             (self.energy_saving, None if saved is None else saved.energy_saving_ratio),
                             (self.throughput_loss, None if saved is None else saved.throughput_loss_ratio)):
            changed = self._put(gauge, key, value) or changed
        return changed

    @_changes
    def clear_realized(self, gpu: int, uuid: str) -> bool:
        """Withdraw a GPU's realized savings (its cap was given back: there is nothing applied to measure)."""
        changed = False
        for gauge in (self.power_saved, self.energy_saving, self.throughput_loss):
            for shown, labels in [k for k in self._shown if k[0] is gauge]:
                if labels[:2] == (str(gpu), uuid):
                    changed = self._put(gauge, labels, None) or changed
        return changed

    def _put(self, gauge: Gauge, labels: tuple[str, ...], value: float | None) -> bool:
        """Show ``value`` (None: no series) in ``gauge``; True if that changed what the registry holds."""
        key = (gauge, labels)
        if value is None:
            if key not in self._shown:
                return False
            del self._shown[key]
            try:
                gauge.remove(*labels)
            except KeyError:
                pass
            return True
        if self._shown.get(key) == value:
            return False
        gauge.labels(*labels).set(value)
        self._shown[key] = value
        return True
