"""A probe scheduler driven by hand in tests: its APScheduler started paused, a schedule's job fired when
the test says, each dispatch waited out; and test nodes made on demand, each stopped after the test."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

#: The job of the first schedule (llm) on GPU 0.
JOB = "0-llm-gpu0"


class Stoppable(Protocol):
    def stop(self) -> None: ...


N = TypeVar("N", bound=Stoppable)


def fire(scheduler: Any, job_id: str = JOB) -> None:
    """``job_id`` falls due now: its job runs as its trigger would run it (the APScheduler is paused)."""
    job = scheduler.scheduler.get_job(job_id)
    job.func(*job.args, **job.kwargs)


def dispatch(scheduler: Any, timeout: float = 30.0) -> int:
    """One dispatch of ``scheduler`` (a ProbeScheduler), its runs waited out (at most ``timeout``
    seconds): how many runs it started."""
    started = scheduler.dispatch_once()
    deadline = time.monotonic() + timeout
    while scheduler._running and time.monotonic() < deadline:
        time.sleep(0.01)
    return started


def nodes_stopped_after(make: Callable[..., N]) -> Iterator[Callable[..., N]]:
    """A fixture's body: ``make(**kwargs)`` for each node the test asks for, and every node made stopped
    after the test."""
    made: list[N] = []

    def node(**kwargs: Any) -> N:
        made.append(make(**kwargs))
        return made[-1]

    yield node
    for n in made:
        n.stop()
