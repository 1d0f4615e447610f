"""The HTTP endpoint: /metrics, /healthz and the landing page at /.

A small threaded server on the standard library, so the exporter has no web
framework to carry. TLS and basic auth (exporter-toolkit web config) plug in
through :class:`RequestGate`; everything else here is plain routing.
"""

from __future__ import annotations

import gzip
import io
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpuperfd.telemetry.exposition import CONTENT_TYPE_OPENMETRICS, CONTENT_TYPE_TEXT

log = logging.getLogger(__name__)

#: Seconds a client may take to send a whole request line and header block (slowloris bound).
REQUEST_TIMEOUT_SECONDS = 30.0
#: Largest header block accepted; larger gets 431 (the standard library alone allows 100 x 64 KiB).
MAX_HEADER_BYTES = 64 * 1024


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] | None = None


class RequestGate:
    """Decides whether a request may proceed; the default lets every request in."""

    def check(self, handler: BaseHTTPRequestHandler) -> Response | None:
        """None to allow, or the response to send instead (e.g. 401)."""
        return None


Route = Callable[[BaseHTTPRequestHandler], Response]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], family: int) -> None:
        self.address_family = family
        super().__init__(address, handler)

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that went away mid-response is routine; anything else is logged, not printed raw."""
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("http client %s went away: %r", client_address, exc)
        else:
            log.exception("error handling a request from %s", client_address)


class _DeadlineReader(io.RawIOBase):
    """Socket reads bounded by the handler's deadline for the request line and headers.

    A per-read timeout alone lets a client that sends one byte every few seconds
    hold a connection and a thread forever (slowloris); this bounds the whole head.
    """

    def __init__(self, sock: socket.socket, handler: "BaseHTTPRequestHandler") -> None:
        self._sock = sock
        self._handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        deadline = getattr(self._handler, "_head_deadline", None)
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("request head not received in time")
            self._sock.settimeout(remaining)
        return self._sock.recv_into(buffer)


def _weighted(header: str) -> list[tuple[str, dict[str, str], float]]:
    """An Accept-style header as (lower-case token, parameters, q) per element; malformed q drops the element."""
    items = []
    for element in header.split(","):
        token, *params = (part.strip() for part in element.split(";"))
        if not token:
            continue
        parameters: dict[str, str] = {}
        for param in params:
            key, _, val = param.partition("=")
            parameters[key.strip().lower()] = val.strip().strip('"')
        try:
            q = float(parameters.pop("q", "1"))
        except ValueError:
            continue
        if not 0.0 <= q <= 1.0:
            continue
        items.append((token.lower(), parameters, q))
    return items


#: OpenMetrics versions this exporter's 1.0.0 output satisfies (0.0.1 is what Prometheus calls the draft).
_OPENMETRICS_VERSIONS = {"", "1.0.0", "0.0.1"}


def negotiate(accept: str, accept_encoding: str) -> tuple[bool, bool]:
    """(openmetrics, gzip) for a /metrics request, per RFC 9110 content negotiation.

    OpenMetrics only when the client names it with q > 0 and ranks it at least as
    high as the text format (text/plain, text/* or */*); anything else, an absent
    or unparsable header included, gets the text format, which every client reads.
    gzip when the client accepts it (``gzip``, ``x-gzip`` or ``*``, q > 0) and does
    not rank ``identity`` above it. Names are case-insensitive.
    """
    om_q, text_q = 0.0, 0.0
    for token, params, q in _weighted(accept):
        if token == "application/openmetrics-text" and params.get("version", "") in _OPENMETRICS_VERSIONS:
            om_q = max(om_q, q)
        elif token in ("text/plain", "text/*", "*/*") and params.get("version", "0.0.4") == "0.0.4":
            text_q = max(text_q, q)
    codings = {token: q for token, _, q in _weighted(accept_encoding)}
    gzip_q = codings.get("gzip", codings.get("x-gzip", codings.get("*", 0.0)))
    identity_q = codings.get("identity", 0.0)
    return om_q > 0.0 and om_q >= text_q, gzip_q > 0.0 and gzip_q >= identity_q


def metrics_route(render: Callable[[bool], bytes]) -> Route:
    """Serve ``render(openmetrics)`` as text or OpenMetrics by Accept header, gzip when asked (:func:`negotiate`)."""

    def route(handler: BaseHTTPRequestHandler) -> Response:
        openmetrics, compress = negotiate(handler.headers.get("Accept", ""), handler.headers.get("Accept-Encoding", ""))
        body = render(openmetrics)
        headers = {"Vary": "Accept, Accept-Encoding"}
        if compress:
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        return Response(200, body, CONTENT_TYPE_OPENMETRICS if openmetrics else CONTENT_TYPE_TEXT, headers)

    return route


class WebServer:
    """Routes GET/HEAD requests by path; runs in a background thread."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: dict[str, Route],
        gate: RequestGate | None = None,
        request_timeout_seconds: float = REQUEST_TIMEOUT_SECONDS,
    ) -> None:
        self.routes = routes
        self.gate = gate or RequestGate()
        self.request_timeout_seconds = request_timeout_seconds
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._server = _Server((host, port), self._handler_class(), family)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def server(self) -> ThreadingHTTPServer:
        return self._server

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        web = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "gpuperfd"
            sys_version = ""
            protocol_version = "HTTP/1.1"
            # Headers and body go out as separate writes: without TCP_NODELAY, Nagle's
            # algorithm and the client's delayed ACK add ~40 ms to every keep-alive scrape.
            disable_nagle_algorithm = True
            timeout = web.request_timeout_seconds  # seconds a client may take to send its request
            # Errors found before the version is parsed (garbage, HTTP/0.9) still get a status line.
            default_request_version = "HTTP/1.0"

            def setup(self) -> None:
                super().setup()
                self.rfile.close()
                self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self))

            def handle_one_request(self) -> None:
                self._head_deadline = time.monotonic() + self.timeout
                super().handle_one_request()

            def parse_request(self) -> bool:
                self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
                if len(self.requestline.split()) == 2:  # "GET /path": HTTP/0.9, which nothing we serve speaks
                    self.command, self.request_version = "", self.default_request_version
                    self.close_connection = True
                    self.send_error(400, "HTTP/0.9 requests are not supported")
                    return False
                ok = super().parse_request()
                self._head_deadline = None
                self.connection.settimeout(self.timeout)
                if ok and sum(len(k) + len(v) + 4 for k, v in self.headers.items()) > MAX_HEADER_BYTES:
                    self.close_connection = True
                    self.send_error(431, "Request header fields too large")
                    return False
                return ok

            def _send(self, response: Response, head: bool = False) -> None:
                self.send_response(response.status)
                self.send_header("Content-Type", response.content_type)
                self.send_header("Content-Length", str(len(response.body)))
                for key, value in (response.headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                if not head:
                    self.wfile.write(response.body)

            def _dispatch(self, head: bool) -> None:
                denied = web.gate.check(self)
                if denied is not None:
                    self._send(denied, head)
                    return
                path = self.path.split("?", 1)[0]
                route = web.routes.get(path)
                if route is None:
                    self._send(Response(404, b"not found\n"), head)
                    return
                try:
                    response = route(self)
                except Exception:
                    log.exception("error serving %s", path)
                    response = Response(500, b"internal error\n")
                self._send(response, head)

            def do_GET(self) -> None:  # noqa: N802
                self._dispatch(head=False)

            def do_HEAD(self) -> None:  # noqa: N802
                self._dispatch(head=True)

            def _not_allowed(self) -> None:
                self._send(Response(405, b"method not allowed\n", headers={"Allow": "GET, HEAD"}))

            do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed  # noqa: N815

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                log.debug("http %s %s", self.address_string(), format % args)

        return Handler

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:  # shutdown() waits for serve_forever: only if it runs
            self._server.shutdown()
            self._thread.join(5)
            self._thread = None
        self._server.server_close()
