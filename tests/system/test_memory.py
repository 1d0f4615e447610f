"""release_free_memory gives freed heap pages back to the kernel (glibc's malloc_trim)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from gpuperfd.system import memory

BURST = textwrap.dedent("""
    import gc, json
    from gpuperfd.system.memory import release_free_memory

    def rss():
        with open("/proc/self/status") as handle:
            return next(int(line.split()[1]) / 1024 for line in handle if line.startswith("VmRSS:"))

    base = rss()
    burst = [bytes(2000) for _ in range(30000)]  # ~60 MB of malloc'd (not pymalloc) blocks
    fence = bytes(2000)  # allocated last: the heap's top is in use, so free() alone cannot shrink it
    peak = rss()
    del burst
    gc.collect()
    freed = rss()
    ok = release_free_memory()
    print(json.dumps({"base": base, "peak": peak, "freed": freed, "trimmed": rss(), "ok": ok}))
""")


def test_freed_heap_pages_go_back_to_the_kernel() -> None:
    out = subprocess.run([sys.executable, "-c", BURST], capture_output=True, text=True, timeout=60, check=True)
    figures = __import__("json").loads(out.stdout)
    assert figures["ok"] is True  # glibc (Debian)
    assert figures["peak"] - figures["base"] > 50
    assert figures["freed"] - figures["base"] > 40  # free() kept the pages: the fence holds the heap's top
    assert figures["freed"] - figures["trimmed"] > 40, figures  # malloc_trim gave them back


def test_without_malloc_trim_it_says_so(monkeypatch) -> None:
    monkeypatch.setattr(memory, "_MALLOC_TRIM", None)
    assert memory.release_free_memory() is False
