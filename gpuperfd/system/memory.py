"""Give the C heap's free pages back to the kernel after the daemon's bursts of allocation.

Start-up (config parsing, NVML's init, the first collection) and a probe round (the
child's JSON results, history lines) allocate and free many small objects; glibc keeps
the freed pages in its arenas, so the resident size stays at the burst's high-water
mark. ``malloc_trim(0)`` returns them (about 1.5 MB after start on a simulated node,
docs/benchmarks.md). Elsewhere than glibc (musl) it is a no-op.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:  # the process's own symbols hold the C library's (no ldconfig lookup, no file)
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _load_malloc_trim()


def release_free_memory() -> bool:
    """Return the heap's free pages to the kernel; False where the C library cannot."""
    if _MALLOC_TRIM is None:
        return False
    try:
        _MALLOC_TRIM(0)
    except OSError as exc:  # never worth failing for
        log.debug("malloc_trim failed: %s", exc)
        return False
    return True
