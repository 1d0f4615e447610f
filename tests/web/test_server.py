"""/metrics content negotiation: Accept and Accept-Encoding with q-values, and Vary (RFC 9110)."""

from __future__ import annotations

import gzip

import pytest
import requests

from gpuperfd.web.server import WebServer, metrics_route, negotiate

PROMETHEUS_2_42 = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                   "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


@pytest.mark.parametrize("accept,openmetrics", [
    (PROMETHEUS_2_42, True),
    ("application/openmetrics-text", True),
    ("Application/OpenMetrics-Text; version=1.0.0", True),
    ("application/openmetrics-text;version=1.0.0;q=0", False),  # q=0 means "not acceptable"
    ("application/openmetrics-text; q=0.0, text/plain", False),
    ("application/openmetrics-text;q=0.4,text/plain;version=0.0.4;q=0.5", False),  # text ranked higher
    ("text/plain;q=0.5,application/openmetrics-text;q=0.6", True),
    ("application/openmetrics-text;version=2.0.0", False),  # a version we do not write
    ("application/openmetrics-text;q=abc", False),  # malformed q: the element is ignored
    ("text/plain;version=0.0.4", False),
    ("*/*", False),
    ("", False),
])
def test_accept_header(accept, openmetrics):
    assert negotiate(accept, "")[0] is openmetrics


@pytest.mark.parametrize("encoding,compress", [
    ("gzip", True),
    ("GZIP", True),
    ("deflate, gzip;q=1.0, br", True),
    ("gzip;q=0", False),
    ("gzip; q=0.000", False),
    ("identity", False),
    ("identity, gzip;q=0.5", False),  # identity ranked higher
    ("identity;q=0, gzip;q=0.5", True),
    ("x-gzip", True),
    ("*", True),
    ("*, gzip;q=0", False),  # gzip named explicitly: its own q wins over *
    ("deflate, br", False),
    ("nogzip", False),  # a substring is not a coding
    ("", False),
])
def test_accept_encoding_header(encoding, compress):
    assert negotiate("", encoding)[1] is compress


@pytest.fixture
def server():
    web = WebServer("127.0.0.1", 0, {"/metrics": metrics_route(
        lambda om: b"a 1\n# EOF\n" if om else b"a 1\n")})
    web.start()
    yield f"http://127.0.0.1:{web.port}/metrics"
    web.stop()


def test_responses_vary_on_accept_and_encoding_and_match_what_was_negotiated(server):
    session = requests.Session()
    session.trust_env = False
    om = session.get(server, headers={"Accept": PROMETHEUS_2_42, "Accept-Encoding": "gzip"}, stream=True)
    assert om.headers["Vary"] == "Accept, Accept-Encoding"
    assert om.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert om.headers["Content-Encoding"] == "gzip" and gzip.decompress(om.raw.read()) == b"a 1\n# EOF\n"
    text = session.get(server, headers={"Accept": "application/openmetrics-text;q=0", "Accept-Encoding": "gzip;q=0"})
    assert text.headers["Vary"] == "Accept, Accept-Encoding"
    assert text.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "Content-Encoding" not in text.headers and text.content == b"a 1\n"
