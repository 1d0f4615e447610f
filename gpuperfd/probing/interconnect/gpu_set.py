"""Which GPUs an interconnect probe runs on: the set asked for, checked against the node.

One rule for the CLI, ``gpuperfd check`` and the daemon's schedule: at least two GPUs, each on
the node, none twice; ``None`` means every GPU of the node. A bad set is a ``ValueError`` naming
what is wrong, raised before anything starts.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["check_set"]


def check_set(asked: Sequence[int] | None, node: Sequence[int], what: str = "GPU") -> tuple[int, ...]:
    """The set to probe, in the order asked (``node``: the indices this node has)."""
    gpus = tuple(node) if asked is None else tuple(asked)
    seen: set[int] = set()
    for index in gpus:
        if index in seen:
            raise ValueError(f"gpus: {what} {index} is named twice")
        seen.add(index)
        if index not in node:
            have = ", ".join(map(str, node)) or "none"
            raise ValueError(f"gpus: no {what} {index} on this node ({what}s: {have})")
    if len(gpus) < 2:  # a count, then the indices: "got 0" once read as zero GPUs where GPU 0 was meant
        named = f" ({what} {gpus[0]})" if gpus else ""
        where = "this node has" if asked is None else "the set asked for has"
        raise ValueError(f"gpus: the interconnect probe needs at least two {what}s; {where} {len(gpus)}{named}")
    return gpus
