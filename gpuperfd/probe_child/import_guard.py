"""Optional packages a probe child never uses, marked absent before torch and transformers load.

A child's start is its imports (issue 60: 9.4 s warm, 13.4 s cold for llm on the lent H200 node,
``benchmarks/diag/child_imports.py``), and part of them is packages no probe calls: transformers'
availability checks import scipy and torchvision where installed, and Dynamo's trace rules look up
scikit-learn and pandas, whose imports pull in pyarrow. None of them is a dependency of gpuperfd;
a node that has them for its users' jobs made every probe child pay for them.

``sys.modules[name] = None`` is Python's own "not importable" mark: ``import name`` raises
``ModuleNotFoundError`` and ``importlib.util.find_spec(name)`` answers None, the same as on a node
without the package, which is how these packages' callers already handle their absence (every
probe runs on machines without them, this one and CI included). PIL stays: a ViT probe with a
``dataset_path`` reads its images with it.

Only the probe child's process entry calls this (never the daemon or a library caller: it changes
the importing process for good).
"""

from __future__ import annotations

import sys

__all__ = ["UNUSED", "mark_unused_absent"]

#: Top-level packages no probe child imports on purpose (each a second or less, together seconds).
UNUSED = ("sklearn", "pandas", "pyarrow", "scipy", "torchvision", "tensorflow", "jax", "flax")


def mark_unused_absent(names: tuple[str, ...] = UNUSED) -> list[str]:
    """Mark ``names`` not importable in this process; returns those marked (a package some code
    already imported is left as it is: taking it away would break its importer)."""
    marked = []
    for name in names:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]
            marked.append(name)
    return marked
