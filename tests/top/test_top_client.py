"""Where ``gpuperfd top`` looks for the daemon, and what it says when the answer is not a frame."""

from __future__ import annotations

import pytest

from gpuperfd.config import config_from_mapping
from gpuperfd.top.client import DaemonAddress, DaemonSource, TopError, daemon_url
from gpuperfd.web.server import Response, WebServer


@pytest.mark.parametrize(("listen", "url"), [
    ("0.0.0.0:10187", "http://127.0.0.1:10187"),
    (":9400", "http://127.0.0.1:9400"),
    ("[::]:9400", "http://[::1]:9400"),
    ("[fd00::5]:9400", "http://[fd00::5]:9400"),
    ("10.0.0.5:9400", "http://10.0.0.5:9400"),
])
def test_the_daemon_is_asked_where_its_config_says_it_listens(listen: str, url: str) -> None:
    assert daemon_url(config_from_mapping({"web": {"listen_address": listen}}, "<test>")) == url


def test_an_unreadable_web_config_is_named(tmp_path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config: {cert_file: missing.crt, key_file: missing.key}\n")
    config = config_from_mapping({"web": {"listen_address": "127.0.0.1:1", "config_file": str(web)}}, "<test>")
    with pytest.raises(TopError, match=f"cannot read the daemon's web config {web}"):
        daemon_url(config)


@pytest.mark.parametrize(("routes", "words"), [
    ({}, "does not serve /api/v1/gpus (a gpuperfd older than `top`?)"),
    ({"/api/v1/gpus": lambda _h: Response(200, b"<html>")}, "did not answer JSON"),
    ({"/api/v1/gpus": lambda _h: Response(200, b'{"schema": "other/9", "gpus": []}')}, "answered an unknown shape"),
    ({"/api/v1/gpus": lambda _h: Response(503, b"busy")}, "answered HTTP 503 for /api/v1/gpus"),
])
def test_answers_that_are_not_a_frame_say_what_they_were(routes, words: str) -> None:
    server = WebServer("127.0.0.1", 0, routes)
    server.start()
    try:
        with pytest.raises(TopError, match=words.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
            DaemonSource(DaemonAddress(f"http://127.0.0.1:{server.port}")).fetch()
    finally:
        server.stop()
