"""Servers that are not what a client expects: a port answering bytes that are not HTTP, an HTTP server
whose JSON nests past Python's recursion limit. Shared by the tests of ``top --url`` and ``report --prometheus``."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

#: What an SSH server (or anything not HTTP) might send, with an escape code that must not reach the terminal.
NOT_HTTP = b"SSH-2.0-OpenSSH_9.6\r\n\x1b[31mRED\x00\r\n"


@pytest.fixture
def raw_port() -> Iterator[int]:
    """A port that answers every connection with bytes that are not HTTP."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(4096)
                    conn.sendall(NOT_HTTP)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


@pytest.fixture
def deep_json_port() -> Iterator[int]:
    """An HTTP server whose JSON nests deeper than Python's recursion limit."""
    body = b"[" * 100_000 + b"]" * 100_000

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
