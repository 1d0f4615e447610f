"""Dataclasses read back from JSON dicts: which keys they keep, decided in one place.

Results are read leniently (a newer writer may add keys an older reader ignores); specs and
interconnect results are refused whole when a key is unknown (a typo must not pass silently).
"""

from __future__ import annotations

import dataclasses
from typing import Any


def field_names(cls: type) -> set[str]:
    """The dataclass ``cls``'s field names."""
    return {f.name for f in dataclasses.fields(cls)}


def known_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """Keep only the dataclass's fields: newer writers may add keys old readers ignore."""
    names = field_names(cls)
    return {k: v for k, v in data.items() if k in names}


def refuse_unknown_fields(cls: type, data: dict[str, Any]) -> None:
    """ValueError naming every key of ``data`` that is not a field of ``cls`` (first, as other field errors)."""
    unknown = sorted(set(data) - field_names(cls))
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: unknown {cls.__name__} field(s)")
