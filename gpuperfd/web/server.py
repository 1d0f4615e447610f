"""The HTTP endpoint: /metrics, /healthz and the landing page at /.

A small server on the standard library, so the exporter has no web framework
to carry: :mod:`gpuperfd.web.connections` holds the connections (bounded, with
deadlines, TLS handshakes in its loop) and hands each complete request to a
fixed pool of workers, which run the :class:`http.server.BaseHTTPRequestHandler`
here. TLS and basic auth (exporter-toolkit web config) plug in through
:class:`RequestGate` and ``WebServer.tls``; everything else here is plain routing.
"""

from __future__ import annotations

import gzip
import io
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from gpuperfd.telemetry.exposition import CONTENT_TYPE_OPENMETRICS, CONTENT_TYPE_TEXT
from gpuperfd.web.connections import Conn, ConnectionLoop, Limits, Problem
from gpuperfd.web.request import parse_fields

log = logging.getLogger(__name__)

#: Seconds a client may take to send a whole request line and header block (slowloris bound).
REQUEST_TIMEOUT_SECONDS = Limits.header_timeout
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


class _SocketWriter(io.BufferedIOBase):
    """The handler's wfile. In a worker every write goes out whole (socket timeout: the limits'
    write_timeout); on the connection loop (``conn.out`` set, the socket non-blocking) a write
    sends what the socket takes and keeps the rest in ``conn.out`` for the loop to send."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[no-untyped-def, override]
        out = self._conn.out
        if out is None:
            self._conn.sock.sendall(data)
        elif out:
            out += data
        else:
            try:
                sent = self._conn.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            if sent < len(data):
                out += memoryview(data)[sent:]
        return len(data)


def _flush_head_and_body(handler: Any) -> None:
    """The handler's head and body in one write: one syscall, not two (with TCP_NODELAY a separate
    head is its own packet and its own wake-up of the client)."""
    data = b"".join([*getattr(handler, "_headers_buffer", ()), handler._body_after_head])
    handler._headers_buffer = []
    handler._body_after_head = b""
    handler.wfile.write(data)


def _parse_request(handler: Any) -> bool:
    """The request line as the standard library reads it; the header fields with our own strict
    parser (:mod:`gpuperfd.web.request`), not :mod:`email.feedparser` (a fifth of a scrape's time)."""
    handler.command = None
    handler.request_version = handler.default_request_version
    handler.close_connection = True
    handler.requestline = str(handler.raw_requestline, "iso-8859-1").rstrip("\r\n")
    words = handler.requestline.split()
    if not words:
        return False
    if len(words) == 2:  # "GET /path": HTTP/0.9, which nothing we serve speaks
        handler.command = ""
        handler.send_error(400, "HTTP/0.9 requests are not supported")
        return False
    if len(words) != 3:
        handler.send_error(400, f"Bad request syntax ({handler.requestline!r})")
        return False
    version = words[2]
    number = version[5:].split(".") if version.startswith("HTTP/") else []
    if len(number) != 2 or not all(n.isdigit() and len(n) <= 10 for n in number):
        handler.send_error(400, f"Bad request version ({version!r})")
        return False
    major, minor = int(number[0]), int(number[1])
    if major >= 2:
        handler.send_error(505, f"Invalid HTTP version ({version[5:]})")
        return False
    handler.close_connection = (major, minor) < (1, 1)
    handler.request_version = version
    handler.command, handler.path = words[0], words[1]
    if handler.path.startswith("//"):  # gh-87389, as the standard library: no open redirect
        handler.path = "/" + handler.path.lstrip("/")
    fields = parse_fields(handler.rfile.read())
    if isinstance(fields, tuple):
        handler.close_connection = True
        handler.send_error(*(handler.framing_problem or fields))
        return False
    handler.headers = fields
    connection = (fields.get("Connection") or "").lower()
    if connection == "close":
        handler.close_connection = True
    elif connection == "keep-alive":
        handler.close_connection = False
    failure = handler.framing_problem or handler._check_head()
    if failure is not None:
        handler.close_connection = True
        handler.send_error(*failure)
        return False
    return True


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


@lru_cache(maxsize=64)  # a scraper sends the same two headers every time
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


class _RequestHandler(BaseHTTPRequestHandler):
    """One request on a connection the loop framed: strict head checks, the gate, the route.

    :meth:`WebServer._handler_class` subclasses it per server, naming the server as ``web``."""

    web: WebServer
    server_version = "gpuperfd"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    # Errors found before the version is parsed (garbage, HTTP/0.9) still get a status line.
    default_request_version = "HTTP/1.0"
    framing_problem: Problem | None = None
    force_close = False
    _body_after_head = b""

    flush_headers = _flush_head_and_body

    parse_request = _parse_request

    def _check_head(self) -> Problem | None:
        """Header size, Host, and the request target (origin or absolute form)."""
        if sum(len(k) + len(v) + 4 for k, v in self.headers.items()) > MAX_HEADER_BYTES:
            return 431, "Request header fields too large"
        hosts = self.headers.get_all("Host") or []
        if len(hosts) > 1 or (not hosts and self.request_version != "HTTP/1.0"):
            return 400, "An HTTP/1.1 request needs exactly one Host header"
        if not self.path.startswith("/"):
            target = urlsplit(self.path)
            if target.scheme.lower() not in ("http", "https") or not target.netloc:
                if self.command == "OPTIONS" and self.path == "*":
                    return None  # asterisk form: 405 below
                return 400, "Request target must be a path or an absolute http(s) URL"
            self.path = (target.path or "/") + (f"?{target.query}" if target.query else "")
        return None

    def handle_expect_100(self) -> bool:
        return True  # bodies are never wanted: the loop closes such a connection after the response

    def _send(self, response: Response, head: bool = False) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for key, value in (response.headers or {}).items():
            self.send_header(key, value)
        if self.force_close:
            self.send_header("Connection", "close")  # also sets close_connection
        self._body_after_head = b"" if head else response.body
        self.end_headers()  # head and body leave in one write (flush_headers)

    def _dispatch(self, head: bool, post: bool = False) -> None:
        denied = self.web.gate.check(self)
        if denied is not None:
            self._send(denied, head)
            return
        path = self.path.split("?", 1)[0]
        route = (self.web.post_routes if post else self.web.routes).get(path)
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
        self.force_close = True  # whatever body it carries is never read: end the connection
        self._send(Response(405, b"method not allowed\n", headers={"Allow": "GET, HEAD"}))

    def do_POST(self) -> None:  # noqa: N802
        """Only the few write paths (``post_routes``), without a body (their arguments in the query)."""
        if self.path.split("?", 1)[0] in self.web.post_routes and not self.force_close:
            self._dispatch(head=False, post=True)
        else:
            self._not_allowed()

    # Methods HTTP defines get 405 with Allow; a method nobody defines gets 501 (RFC 9110).
    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed  # noqa: N815

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        if log.isEnabledFor(logging.DEBUG):  # formatted per request otherwise, for nothing
            log.debug("http %s %s", self.address_string(), format % args)


class WebServer:
    """Routes GET/HEAD requests by path; a connection loop and worker threads run in the background."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: dict[str, Route],
        gate: RequestGate | None = None,
        request_timeout_seconds: float | None = None,
        limits: Limits | None = None,
        inline_paths: frozenset[str] = frozenset(),
        post_routes: dict[str, Route] | None = None,
    ) -> None:
        self.routes = routes
        #: The write paths (POST, no body): behind the same gate (TLS, basic auth) as every read.
        self.post_routes = post_routes or {}
        #: GET/HEAD paths cheap enough to answer on the connection loop itself (no worker hand-off),
        #: when the gate is the default one (a password check may run bcrypt) and TLS is off.
        self.inline_paths = inline_paths
        self.gate = gate or RequestGate()
        limits = limits or Limits()
        if request_timeout_seconds is not None:
            limits = Limits(**{**limits.__dict__, "header_timeout": request_timeout_seconds})
        self.limits = limits
        #: Handler class for each request; :func:`gpuperfd.web.security.add_response_headers` subclasses it.
        self.RequestHandlerClass: type[BaseHTTPRequestHandler] = self._handler_class()
        #: TLS for every connection when set (see :func:`gpuperfd.web.tls.wrap_server_for_tls`).
        self.tls: Any = None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(512)
        except OSError:
            self._listener.close()
            raise
        self._loop: ConnectionLoop | None = None

    @property
    def port(self) -> int:
        return self._listener.getsockname()[1]

    @property
    def loop(self) -> ConnectionLoop | None:
        """The running connection loop (its counters are handy in tests); None before start()."""
        return self._loop

    def _handle(self, conn: Conn, head: bytes, problem: Problem | None, close_after: bool) -> bool:
        """Run one request (in a worker thread); True to keep the connection for the next one."""
        handler = self.RequestHandlerClass.__new__(self.RequestHandlerClass)
        handler.server = self  # type: ignore[assignment]
        handler.request = handler.connection = conn.sock  # type: ignore[attr-defined]
        handler.client_address = conn.address
        handler.rfile = io.BytesIO(head)  # the loop read the whole head; a body never reaches the handler
        handler.wfile = _SocketWriter(conn)
        handler.framing_problem = problem  # type: ignore[attr-defined]
        handler.force_close = close_after  # type: ignore[attr-defined]
        handler.close_connection = True
        handler.handle_one_request()
        return not handler.close_connection and not close_after

    def _inline(self, head: bytes) -> bool:
        """Whether the loop may answer this head itself (see ``inline_paths``)."""
        if type(self.gate) is not RequestGate:
            return False
        method, _, rest = head.partition(b" ")
        target = rest.partition(b" ")[0].partition(b"?")[0]
        return method in (b"GET", b"HEAD") and target.decode("iso-8859-1") in self.inline_paths

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        """This server's handler class: :class:`_RequestHandler` routing through this server."""
        return type("Handler", (_RequestHandler,), {"web": self})

    def start(self) -> None:
        self._loop = ConnectionLoop(self._listener, self._handle, self.limits, self.tls,
                                    self._inline if self.inline_paths else None)
        self._loop.start()

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.stop()
            self._loop.close()
            self._loop = None
        self._listener.close()
