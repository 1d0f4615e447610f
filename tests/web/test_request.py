"""The strict header-field parser the request handler uses instead of email.feedparser."""

from __future__ import annotations

import pytest

from gpuperfd.web.request import MAX_FIELDS, Headers, parse_fields


def test_fields_are_case_insensitive_in_order_and_trimmed() -> None:
    fields = parse_fields(b"Host: a\r\nAccept:  text/plain \t\r\nX-Dup: 1\r\nx-dup: 2\r\nEmpty:\r\n\r\n")
    assert isinstance(fields, Headers)
    assert fields.get("host") == "a" and fields["ACCEPT"] == "text/plain"
    assert fields.get_all("X-DUP") == ["1", "2"] and fields.get_all("absent") is None
    assert fields.get("Empty") == "" and "empty" in fields and "absent" not in fields
    assert fields.get("absent", "d") == "d" and fields["absent"] is None
    assert fields.items() == [("Host", "a"), ("Accept", "text/plain"), ("X-Dup", "1"), ("x-dup", "2"), ("Empty", "")]
    assert len(fields) == 5 and list(fields) == ["Host", "Accept", "X-Dup", "x-dup", "Empty"]


def test_bare_lf_lines_and_obs_text_are_read() -> None:
    fields = parse_fields(b"Host: a\nX-Name: caf\xe9\n\n")
    assert isinstance(fields, Headers) and fields.get("X-Name") == "caf\xe9"


def test_nothing_after_the_blank_line_is_a_field() -> None:
    fields = parse_fields(b"Host: a\r\n\r\nContent-Length: 5\r\n")
    assert isinstance(fields, Headers) and fields.get("Content-Length") is None


@pytest.mark.parametrize(("block", "status"), [
    (b"Host: a\r\n folded\r\n\r\n", 400),  # obs-fold
    (b"Host: a\r\n\tfolded\r\n\r\n", 400),
    (b"Host : a\r\n\r\n", 400),  # space before the colon
    (b"Ho st: a\r\n\r\n", 400),
    (b"no colon here\r\n\r\n", 400),
    (b": no name\r\n\r\n", 400),
    (b"X(A): 1\r\n\r\n", 400),  # name not a token
    (b"X-A: 1\rContent-Length: 5\r\n\r\n", 400),  # bare CR: email.feedparser would see two fields
    (b"X-A: 1\r\r\n\r\n", 400),
    (b"X-A: a\x00b\r\n\r\n", 400),  # NUL
    (b"X-A: a\x7fb\r\n\r\n", 400),  # DEL
    (b"X-A: " + b"x" * 70000 + b"\r\n\r\n", 431),  # one line too long
    (b"X-A: 1\r\n" * (MAX_FIELDS + 1) + b"\r\n", 431),  # too many fields
])
def test_malformed_heads_are_refused(block: bytes, status: int) -> None:
    problem = parse_fields(block)
    assert isinstance(problem, tuple) and problem[0] == status, problem


def test_exactly_the_field_limit_is_accepted() -> None:
    fields = parse_fields(b"X-A: 1\r\n" * MAX_FIELDS + b"\r\n")
    assert isinstance(fields, Headers) and len(fields) == MAX_FIELDS
