"""Where a probe child keeps torch.compile's and Triton's caches: the daemon's state directory.

A probe's first point pays for ``torch.compile`` and Triton's kernel builds; by default their caches
live under /tmp (``torchinductor_<user>``), which systemd's PrivateTmp and a container's tmpfs empty at
every restart. In the state directory they survive, so every run after the first loads compiled
kernels instead of building them.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

#: Below the state directory: torch.compile's (Inductor's FX graph and autotuning) and Triton's kernel caches.
COMPILE_CACHE_DIR = "compile-cache"


def compile_cache_env(state_dir: Path | str | None) -> dict[str, str]:
    """Environment that keeps a probe child's compile caches in ``state_dir`` (none without one).

    The folders are the daemon's own (mode 0700): a cache is code that the child will run. A folder
    that cannot be made leaves the child compiling from scratch (logged), never failing the probe.
    """
    if state_dir is None:
        return {}
    root = Path(state_dir) / COMPILE_CACHE_DIR
    try:
        for sub in ("", "inductor", "triton"):
            (root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("no compile cache in %s (%s): every run compiles from scratch", root, exc)
        return {}
    return {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton"),
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
