"""Waiting in tests for what another process or thread does: one ``wait_for`` for them all."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, log: Callable[[], str] = lambda: "",
             what: str = "condition", interval: float = 0.05) -> T:
    """``predicate()``'s first true answer, asked every ``interval`` seconds; after ``timeout`` seconds
    fails naming ``what``, with the end of ``log()`` (a daemon's log, say) where one is given."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}\n{log()[-3000:]}".rstrip())
        time.sleep(interval)
    return value
