"""A request head's header fields, parsed strictly and cheaply (RFC 9112 section 5).

The standard library parses them with :mod:`email.feedparser`, which was a fifth of a
keep-alive scrape's time and is lenient where HTTP must not be (it splits lines at a bare
CR, folds continuation lines). This parser reads only what a request head may hold:
``name ":" OWS value OWS`` lines, the name a token, the value without control characters
(HTAB allowed), nothing folded; and keeps the standard library's limits (100 fields,
64 KiB a line: 431 beyond). Names are case-insensitive; values keep their order.
"""

from __future__ import annotations

from collections.abc import Iterator

#: Most header fields in one request (as http.client).
MAX_FIELDS = 100
#: Longest header line (as http.client).
MAX_FIELD_LINE = 65536

#: (status, reason) to answer a bad head with.
Problem = tuple[int, str]

_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
#: Control characters a field value may not hold (HTAB is allowed; CR and NUL are the dangerous ones).
_CTL = frozenset(chr(c) for c in (*range(0x00, 0x09), *range(0x0A, 0x20), 0x7F))


class Headers:
    """Request header fields: the part of :class:`email.message.Message`'s interface handlers use."""

    __slots__ = ("_fields",)

    def __init__(self, fields: list[tuple[str, str, str]]) -> None:
        self._fields = fields  # (name as sent, lower-case name, value)

    def get(self, name: str, default: str | None = None) -> str | None:
        """The first field's value of that name (any case), else ``default``."""
        lname = name.lower()
        for _, key, value in self._fields:
            if key == lname:
                return value
        return default

    def get_all(self, name: str, failobj: list[str] | None = None) -> list[str] | None:
        lname = name.lower()
        values = [value for _, key, value in self._fields if key == lname]
        return values or failobj

    def __getitem__(self, name: str) -> str | None:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def items(self) -> list[tuple[str, str]]:
        return [(name, value) for name, _, value in self._fields]

    def keys(self) -> list[str]:
        return [name for name, _, _ in self._fields]

    def values(self) -> list[str]:
        return [value for _, _, value in self._fields]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._fields)


def parse_fields(block: bytes) -> Headers | Problem:
    """The header fields of ``block`` (the head after the request line, up to its blank line),
    or the problem to answer with: 431 for too many or too long lines, 400 for a malformed one."""
    fields: list[tuple[str, str, str]] = []
    for raw in block.decode("iso-8859-1").split("\n"):
        if len(raw) > MAX_FIELD_LINE:
            return 431, "Line too long"
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line:
            break  # the blank line ending the head
        if len(fields) >= MAX_FIELDS:
            return 431, "Too many headers"
        if line[0] in " \t":
            return 400, "Obsolete line folding in a header field is not accepted"
        name, sep, value = line.partition(":")
        if not sep or not name or not _TCHAR.issuperset(name):
            return 400, "Malformed header field line"
        value = value.strip(" \t")
        if not _CTL.isdisjoint(value):
            return 400, "Invalid character in a header field value"
        fields.append((name, name.lower(), value))
    return Headers(fields)
