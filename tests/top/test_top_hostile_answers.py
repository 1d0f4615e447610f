"""``gpuperfd top --url`` at things that are not a gpuperfd daemon: a clear line and an exit code, never a
traceback, and never the peer's bytes on the terminal."""

from __future__ import annotations

import pytest

from gpuperfd.cli import main
from hostile_servers import NOT_HTTP, deep_json_port, raw_port  # noqa: F401 (fixtures)

def _top(url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["top", "--once", "--url", url])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, err


def test_a_port_that_answers_not_http_is_named_and_its_bytes_are_not_printed(raw_port, capsys) -> None:
    code, err = _top(f"http://127.0.0.1:{raw_port}", capsys)
    assert code == 1
    assert "did not answer HTTP" in err and "is a gpuperfd daemon listening there?" in err
    assert NOT_HTTP.decode()[:7] not in err and "\x1b" not in err


def test_json_nested_past_the_recursion_limit_is_not_json_to_top(deep_json_port, capsys) -> None:
    code, err = _top(f"http://127.0.0.1:{deep_json_port}", capsys)
    assert code == 1
    assert "did not answer JSON" in err


@pytest.mark.parametrize(("url", "words"), [
    ("garbage", "the daemon speaks http or https, not a URL without a scheme"),
    ("http://[::1", "is not a URL (Invalid IPv6 URL)"),
    ("http://127.0.0.1:port", "is not a URL"),
    ("ftp://127.0.0.1:21", "the daemon speaks http or https, not ftp://"),
    ("file:///etc/passwd", "not file://"),
    ("http://", "names no host"),
])
def test_a_url_that_is_not_an_http_address_is_a_usage_error_naming_the_flag(url: str, words: str, capsys) -> None:
    code, err = _top(url, capsys)
    assert code == 2
    assert f"--url {url!r}" in err and words in err
