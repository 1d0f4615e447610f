"""How many probe children may run at once: the host-memory book of their reservations.

Why: each probe child (torch, a model, CUDA's host allocations) peaks at about 1.6-2.0 GiB of
host memory; with ``probes.parallel_gpus`` every idle GPU starts one at the same moment, and a
container sized for one child is OOM-killed on every round (3.54 GiB on a 2-GPU H200 node,
~14 GiB on 8 GPUs). So a round reserves its child's expected peak before it starts one, and a
GPU whose reservation does not fit waits, in arrival order, until a running child ends.

Who waits and who goes is decided in one place: the GPU turns' one rule
(:class:`~gpuperfd.probing.gates.turns.GpuTurns`: a claimant states its child's memory when it queues for
the GPU, and gets the GPU and the memory in one step). This module is the book that rule reads: the
budget, what is reserved, the state the series show, and the words of a wait and of a refusal. It
queues nobody.

The budget: ``limit - the daemon's own RSS - HEADROOM_BYTES``, where the limit is the smaller of
the cgroup's memory limit and ``probes.memory_budget`` (:func:`memory_limit`). No limit at all:
every reservation fits at once (still counted). A reservation larger than the whole budget
never fits: it is refused at once with reason ``memory_budget`` (one error log line saying what
to change), never queued forever and never started into an OOM kill.

The expected peak of a child is the largest host RSS measured for its probes
(:class:`PeakBook`, fed by the runner when a child exits), or ``DEFAULT_CHILD_BYTES`` before any
measurement. The simulated executor starts no child and needs no admission.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpuperfd.system.cgroup_memory import memory_limit_bytes, status_bytes

log = logging.getLogger(__name__)

MIB = 2**20
GIB = 2**30
#: A probe child's host RSS before one was measured here: 2 GiB. Children of the default llm and vit
#: presets peaked at 2,006-2,009 MiB (ru_maxrss) on a 4x H200 node (docs/benchmarks.md, issue 41);
#: the 2-GPU H200 node's tree reached 3.54 GiB with two; docs/benchmarks.md has 0.9-1.6 GiB on an H100.
DEFAULT_CHILD_BYTES = 2 * GIB
#: Kept free beside the daemon and the children: compile workers outside the measured leader,
#: page cache the cgroup charges (history, compile caches), the 64 MiB tmpfs, allocator slack.
HEADROOM_BYTES = 256 * MIB
#: How often a waiter looks at its abort event and deadline when nothing wakes it.
POLL_SECONDS = 0.25
#: The daemon's RSS (/proc/self/status) is read at most this often: every waiter wakes each
#: POLL_SECONDS, and a budget that moves by a few MiB a second needs no fresher figure.
RSS_READ_SECONDS = 2.0


def memory_limit(budget_bytes: int | None, cgroup_limit: Callable[[], int | None] = memory_limit_bytes,
                 ) -> tuple[int | None, str]:
    """The limit the children must fit in and where it came from: the smaller of the cgroup's
    limit and the configured budget (``probes.memory_budget``); (None, "none") when neither is set."""
    found = [(v, s) for v, s in ((cgroup_limit(), "cgroup memory limit"), (budget_bytes, "probes.memory_budget"))
             if v is not None]
    if not found:
        return None, "none"
    return min(found)


class PeakBook:
    """The largest measured peak host RSS per probe name (bytes); thread-safe."""

    def __init__(self, default_bytes: int = DEFAULT_CHILD_BYTES) -> None:
        self.default_bytes = default_bytes
        self._peaks: dict[str, int] = {}
        self._lock = threading.Lock()
        #: Told (probe, bytes) when a probe's largest peak grows.
        self.listeners: list[Callable[[str, int], None]] = []

    def record(self, probe: str, peak_bytes: int) -> None:
        with self._lock:
            if peak_bytes <= self._peaks.get(probe, 0):
                return
            self._peaks[probe] = peak_bytes
        log.info("probe %s: its child peaked at %.0f MiB of host memory (the largest seen)", probe, peak_bytes / MIB)
        for listener in self.listeners:
            listener(probe, peak_bytes)

    def expected(self, probes: Iterable[str]) -> int:
        """The peak a child running all ``probes`` is expected to reach: the largest of theirs
        (one child carries a round's probes one after another), the default for one never measured."""
        with self._lock:
            return max((self._peaks.get(p, self.default_bytes) for p in probes), default=self.default_bytes)

    def peaks(self) -> dict[str, int]:
        with self._lock:
            return dict(self._peaks)


@dataclass(frozen=True)
class Ticket:
    """A reservation's answer: granted (``reason`` empty; release it) or refused, with why:
    ``memory_budget`` (never fits), ``aborted`` (shutting down) or ``deadline``."""

    gpu: int
    bytes: int
    waited_seconds: float = 0.0
    reason: str = ""

    @property
    def granted(self) -> bool:
        return not self.reason


@dataclass(frozen=True)
class AdmissionState:
    """What the series show: the budget now (None: no limit), children running and waiting."""

    budget_bytes: int | None
    source: str
    running: int
    waiting: int
    wait_seconds_total: float
    reserved_bytes: int = 0
    peaks: dict[str, int] = field(default_factory=dict)


class Admission:
    """The book of host-memory reservations for probe children (thread-safe): the budget, what is
    reserved, the refusal's words. It decides nothing on its own: :class:`~gpuperfd.probing.gates.turns.GpuTurns`
    asks it (under the turns' lock) whether a reservation fits and records what it decides here."""

    def __init__(self, limit_bytes: int | None, source: str = "cgroup memory limit", peaks: PeakBook | None = None,
                 daemon_rss: Callable[[], int | None] = lambda: status_bytes("VmRSS"),
                 headroom_bytes: int = HEADROOM_BYTES, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_bytes, self.source = limit_bytes, source
        self.peaks = peaks or PeakBook()
        self.headroom_bytes = headroom_bytes
        self._daemon_rss, self._clock = daemon_rss, clock
        self._lock = threading.RLock()
        self._reserved = self._running = self._waiting = 0
        self._wait_total = 0.0
        self._warned = False
        #: The daemon's RSS last read, and when (the book's clock); read again when older than
        #: RSS_READ_SECONDS, or at once after a child ended (a release), a grant or the limit changed.
        self._rss: tuple[int | None, float] | None = None
        #: Told the new :class:`AdmissionState` after every change (the turns tell it under their lock:
        #: a listener must not take a GPU's turn).
        self.listeners: list[Callable[[AdmissionState], None]] = []

    def set_limit(self, limit_bytes: int | None, source: str) -> None:
        """A new limit (a reload changed ``probes.memory_budget``); a budget too small for one child
        is logged once more. The waiters look again at their next poll (or the turns' nudge)."""
        with self._lock:
            if (limit_bytes, source) != (self.limit_bytes, self.source):
                self.limit_bytes, self.source, self._warned = limit_bytes, source, False
                self._rss = None
        self.publish()

    def describe(self) -> str:
        """One line for the start-up log: the limit, the budget, and how many default-sized children fit."""
        budget = self.budget_bytes()
        if budget is None:
            return "probe children: no memory limit (cgroup or probes.memory_budget): every idle GPU's child at once"
        fits = max(0, budget // self.peaks.default_bytes)
        return (f"probe children: {self.source} {self.limit_bytes / MIB:.0f} MiB, {budget / MIB:.0f} MiB for children "
                f"(less the daemon and {self.headroom_bytes / MIB:.0f} MiB headroom): {fits} child(ren) of "
                f"~{self.peaks.default_bytes / MIB:.0f} MiB at once until measured; the others wait their turn")

    def now(self) -> float:
        """The book's clock (a wait's seconds are measured on it)."""
        return self._clock()

    def budget_bytes(self) -> int | None:
        """Memory the children may use together now: limit - daemon RSS - headroom (None: no limit)."""
        with self._lock:
            if self.limit_bytes is None:
                return None
            return self.limit_bytes - (self._rss_bytes() or 0) - self.headroom_bytes

    def _rss_bytes(self) -> int | None:
        """The daemon's RSS, read from /proc at most every RSS_READ_SECONDS (not at every waiter's wake-up)."""
        now = self._clock()
        kept = self._rss
        if kept is None or now - kept[1] >= RSS_READ_SECONDS or now < kept[1]:
            kept = self._rss = (self._daemon_rss(), now)
        return kept[0]

    def state(self) -> AdmissionState:
        with self._lock:
            return AdmissionState(self.budget_bytes(), self.source, self._running, self._waiting, self._wait_total,
                                  self._reserved, self.peaks.peaks())

    def fits(self, need: int) -> bool:
        """Whether ``need`` more bytes fit beside what is reserved now."""
        with self._lock:
            budget = self.budget_bytes()
            return budget is None or self._reserved + need <= budget

    def never_fits(self, gpu: int, need: int) -> bool:
        """Whether ``need`` is more than the whole budget (it would never fit): the first time since a
        child last fitted, one error line says what to change."""
        with self._lock:
            budget = self.budget_bytes()
            if budget is None or need <= budget:
                return False
            if not self._warned:
                self._warned = True
                limit = self.limit_bytes or 0
                log.error("no probes run: a probe child needs ~%.0f MiB of host memory, but the %s of %.0f MiB "
                          "leaves %.0f MiB for children (less the daemon's %.0f MiB and %.0f MiB headroom); raise "
                          "the container's memory limit (and probes.memory_budget, if set) to at least %.0f MiB "
                          "for one child at a time (docs/operations.md, sizing)",
                          need / MIB, self.source, limit / MIB, budget / MIB,
                          (limit - budget - self.headroom_bytes) / MIB, self.headroom_bytes / MIB,
                          (limit - budget + need) / MIB)
            return True

    def set_waiting(self, gpu: int, need: int, waiting: int, told: bool = False) -> None:
        """How many claimants wait for memory now; ``told``: GPU ``gpu``'s claimant, needing ``need``,
        just began to wait (its one log line)."""
        with self._lock:
            self._waiting = waiting
            if told:
                log.info("gpu %d waits for host memory: its probe child needs ~%.0f MiB, %d child(ren) hold "
                         "%.0f MiB of the %.0f MiB budget", gpu, need / MIB, self._running, self._reserved / MIB,
                         (self.budget_bytes() or 0) / MIB)

    def reserve(self, gpu: int, need: int, waited: float = 0.0, told: bool = False) -> Ticket:
        """Book ``need`` bytes for GPU ``gpu``'s child (the turns found they fit); ``told``: it waited
        and said so, and now says how long. Released by :meth:`release`."""
        with self._lock:
            self._reserved += need
            self._running += 1
            self._wait_total += waited
            self._warned = False
            self._rss = None  # a decision was made: the next look reads the RSS afresh
        if told:
            log.info("gpu %d: host memory for its probe child after %.1f s of waiting", gpu, waited)
        return Ticket(gpu, need, waited)

    def refuse(self, gpu: int, need: int, waited: float, reason: str) -> Ticket:
        """A reservation not made (``reason``), its wait counted."""
        with self._lock:
            self._wait_total += waited
        return Ticket(gpu, need, waited, reason)

    def release(self, ticket: Ticket) -> None:
        """End a granted reservation (its child is gone); the turns wake their memory waiters."""
        if not ticket.granted:
            return
        with self._lock:
            self._reserved -= ticket.bytes
            self._running -= 1
            self._rss = None  # a decision is due: the waiters' next look reads the RSS afresh

    def publish(self) -> None:
        """Tell the listeners the state now."""
        state = self.state()
        for listener in self.listeners:
            listener(state)
