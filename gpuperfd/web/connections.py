"""The HTTP server's connection loop: bounded connections, a fixed pool of request workers.

One thread (``http``) accepts connections, runs TLS handshakes and reads each
request head (and any small body) without blocking; only a complete request
goes to one of a fixed number of worker threads. So an idle, trickling or
never-handshaking client costs one socket and a few hundred bytes, never a
thread, and the thread count is the same under 3 connections or 3,000.
A request the server calls cheap (``inline``: a cached /metrics on a plain
connection with the default gate) is answered on the loop itself, skipping the
hand-off to a worker and back (~0.07 ms of a 0.45 ms keep-alive scrape on the dev VM); its
response is written non-blocking, the rest as the client reads it, under
``write_timeout``, so a slow reader still holds no thread.

Limits (:class:`Limits`, flags ``--web.*``, see docs/configuration.md):

* at most ``max_connections`` open connections; at the cap the connection
  that has waited longest without a request in progress is closed to make
  room (so a flood of idle sockets cannot lock a scraper out); when every
  connection has a request in progress the new one gets a 503 and is closed;
* ``header_timeout`` for the whole request head and body from its first byte
  (from accept for a new connection), ``tls_handshake_timeout`` for the
  handshake, ``idle_timeout`` between keep-alive requests;
* at most ``max_requests`` requests being served or waiting for a worker
  (like node_exporter's ``--web.max-requests``); more get 503 at once.

Framing is decided here, before a handler sees the request: a
``Content-Length`` body of a GET/HEAD up to ``max_body_bytes`` is read and
dropped, and so is a ``Transfer-Encoding: chunked`` body (RFC 9112 section 7.1:
strict chunk-size lines, chunk extensions and trailer fields read and ignored,
the same ``max_body_bytes`` cap on the data, 413 beyond it, 400 for a malformed
chunk); a body on any other method, a larger body, any other transfer coding
(501), ``Transfer-Encoding`` next to Content-Length (400) and malformed header
lines get their response and the connection is closed, after a short
lingering drain so the client still reads the response. A body is never
parsed as the next request.
"""

from __future__ import annotations

import errno
import logging
import queue
import resource
import selectors
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: Longest request line, and longest header line (as http.server: longer gets 414 / 431).
MAX_LINE = 65536
#: Most bytes of request head buffered; more without the blank line ends it with 431.
MAX_HEAD_BYTES = 2 * MAX_LINE + 4096
#: File descriptors kept free for everything else (logs, /proc reads, probe children, NVML).
FD_RESERVE = 128
#: Seconds a closed connection's unread input is drained, so a response is not lost to a reset.
LINGER_SECONDS = 2.0

HANDSHAKE, IDLE, HEAD, BODY, BUSY, LINGER, CLOSED = "handshake", "idle", "head", "body", "busy", "linger", "closed"
#: A response served on the loop whose rest waits for the client to read (see ``ConnectionLoop.inline``).
WRITE = "write"

#: (status, reason) a handler must answer with, then close the connection.
Problem = tuple[int, str]


@dataclass(frozen=True)
class Limits:
    """How much the HTTP server takes on at once; defaults are documented in docs/configuration.md."""

    max_connections: int = 512
    max_requests: int = 256
    workers: int = 4
    header_timeout: float = 10.0
    tls_handshake_timeout: float = 10.0
    idle_timeout: float = 120.0
    write_timeout: float = 30.0
    max_body_bytes: int = 64 * 1024


def raise_fd_limit() -> int:
    """Raise this process's soft open-files limit to the hard limit; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, target, exc)
    return soft


def connection_cap(wanted: int) -> int:
    """``wanted``, lowered to what the open-files limit allows with :data:`FD_RESERVE` kept free."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return wanted
    allowed = max(16, soft - FD_RESERVE)
    if wanted > allowed:
        log.warning("web: max connections lowered from %d to %d by the open-files limit (ulimit -n %d)",
                    wanted, allowed, soft)
    return min(wanted, allowed)


class Tls(Protocol):
    """What the loop needs for TLS (see :class:`gpuperfd.web.tls.TlsHandshakes`)."""

    def context(self) -> tuple[ssl.SSLContext | None, Any]: ...
    def allowed(self, settings: Any, sock: ssl.SSLSocket, address: Any) -> bool: ...
    def failed(self, address: Any, exc: BaseException) -> None: ...


class Conn:
    """One client connection and where it is in its request cycle."""

    __slots__ = ("sock", "fd", "address", "state", "buf", "events", "timer", "deadline", "since", "scanned",
                 "body_end", "head", "problem", "close_after", "eof", "tls_settings", "out", "keep")

    def __init__(self, sock: socket.socket, address: Any) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.address = address
        self.state = HEAD
        self.buf = bytearray()
        self.events = 0
        self.timer: str | None = None
        self.deadline = 0.0
        self.since = 0.0
        self.scanned = 0
        self.body_end = 0
        self.head = b""
        self.problem: Problem | None = None
        self.close_after = False
        self.eof = False
        self.tls_settings: Any = None
        #: Set while a request is served on the loop: what the client has not taken yet (None: a worker
        #: serves it, writing with a blocking sendall).
        self.out: bytearray | None = None
        self.keep = False


def _head_end(buf: bytearray, start: int) -> int:
    """Index just past the blank line ending the head, or -1."""
    ends = [i for i in (buf.find(b"\n\r\n", start), buf.find(b"\n\n", start)) if i >= 0]
    if not ends:
        return -1
    i = min(ends)
    return i + (3 if buf[i + 1:i + 2] == b"\r" else 2)


def framing(method: bytes, version: bytes, header_block: bytes, max_body: int) -> tuple[int, Problem | None, bool]:
    """(body bytes to read and drop, problem, close after) for one request head.

    Strict where a lax reading lets two parties disagree on where a request
    ends (request smuggling): no folded lines, no space before the colon,
    Content-Length digits only and all copies equal, no Transfer-Encoding.
    """
    lengths: list[bytes] = []
    codings: list[bytes] = []
    expect = False
    for raw in header_block.split(b"\n"):
        line = raw[:-1] if raw.endswith(b"\r") else raw
        if not line:
            continue
        if line[:1] in (b" ", b"\t"):
            return 0, (400, "Obsolete line folding in a header field is not accepted"), True
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip() or b" " in name or b"\t" in name:
            return 0, (400, "Malformed header field line"), True
        lname = name.lower()
        if lname == b"content-length":
            lengths.extend(part.strip() for part in value.split(b","))
        elif lname == b"transfer-encoding":
            codings.extend(part.strip().lower() for part in value.split(b","))
        elif lname == b"expect":
            expect = True
    if codings:
        if lengths:
            return 0, (400, "Transfer-Encoding and Content-Length together"), True
        if version == b"HTTP/1.0":
            return 0, (400, "Transfer-Encoding in an HTTP/1.0 request"), True
        if codings != [b"chunked"]:
            return 0, (501, "Transfer coding not supported"), True
        if method not in (b"GET", b"HEAD") or expect:
            return 0, None, True  # as with Content-Length: answered, closed, body unread
        return CHUNKED, None, False
    if not lengths:
        return 0, None, False
    if not all(v.isdigit() and len(v) <= 18 for v in lengths) or len(set(lengths)) != 1:
        return 0, (400, "Invalid Content-Length"), True
    size = int(lengths[0])
    if size == 0:
        return 0, None, False
    if method not in (b"GET", b"HEAD") or expect:
        return 0, None, True  # answered (405, or without the body it waits to send) and closed, body unread
    if size > max_body:
        return 0, (413, f"Request body larger than {max_body} bytes"), True
    return size, None, False


#: ``framing``'s body size for a chunked body (its length is known only once it is read).
CHUNKED = -1
#: Longest chunk-size line (size, extensions): a size has at most 16 hex digits.
MAX_CHUNK_LINE = 4096
_HEX = frozenset(b"0123456789abcdefABCDEF")


def chunked_end(buf: bytearray, max_body: int) -> tuple[int, Problem | None]:
    """Index just past a complete chunked body at the start of ``buf`` (-1: not all there yet),
    or the problem to answer. Strict, as a request smuggler would exploit any leniency: CRLF
    line ends only, hex digits only (no sign, no 0x), CRLF right after each chunk's data."""
    pos = total = 0
    while True:
        eol = buf.find(b"\r\n", pos, pos + MAX_CHUNK_LINE)
        if eol < 0:
            if buf.find(b"\n", pos, pos + MAX_CHUNK_LINE) >= 0:
                return 0, (400, "Malformed chunk size line (bare LF)")
            if len(buf) - pos >= MAX_CHUNK_LINE:
                return 0, (400, "Chunk size line too long")
            return -1, None
        size_text = bytes(buf[pos:eol]).partition(b";")[0].rstrip(b" \t")
        if not size_text or len(size_text) > 16 or not set(size_text) <= _HEX or b"\n" in buf[pos:eol]:
            return 0, (400, "Malformed chunk size")
        size = int(size_text, 16)
        pos = eol + 2
        if size == 0:
            break
        total += size
        if total > max_body:
            return 0, (413, f"Request body larger than {max_body} bytes")
        if len(buf) < pos + size + 2:
            return -1, None
        if buf[pos + size:pos + size + 2] != b"\r\n":
            return 0, (400, "Chunk data not followed by CRLF")
        pos += size + 2
    start = pos  # trailer section: field lines, then an empty line
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            if buf.find(b"\n", pos) >= 0:
                return 0, (400, "Malformed trailer field line (bare LF)")
            if len(buf) - start > MAX_LINE:
                return 0, (431, "Trailer section too large")
            return -1, None
        if eol == pos:
            return eol + 2, None
        name, sep, _ = bytes(buf[pos:eol]).partition(b":")
        if not sep or not name or name != name.strip() or b" " in name or b"\t" in name or b"\n" in name:
            return 0, (400, "Malformed trailer field line")
        pos = eol + 2
        if pos - start > MAX_LINE:
            return 0, (431, "Trailer section too large")


#: Runs one request in a worker: (connection, head, problem, close after) -> keep the connection open.
Handle = Callable[[Conn, bytes, "Problem | None", bool], bool]

_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)


def _busy(message: bytes) -> bytes:
    return _BUSY_RESPONSE % (len(message), message)


class ConnectionLoop:
    """The accept/read loop and the worker pool; see the module docstring."""

    def __init__(self, listener: socket.socket, handle: Handle, limits: Limits, tls: Tls | None = None,
                 inline: Callable[[bytes], bool] | None = None) -> None:
        self.listener = listener
        self.handle = handle
        #: Says of a request head whether it is cheap to answer (a cached /metrics): then, on a plain
        #: connection with nothing else buffered, the loop runs it itself, without the hand-off to a
        #: worker and back, writing what the socket takes at once and the rest as the client reads
        #: (``write_timeout`` bound), so a slow reader still costs no thread.
        self.inline = inline
        self.served_inline = 0  # for tests and the benchmark
        self.limits = limits
        self.tls = tls
        self.max_connections = connection_cap(limits.max_connections)
        self.conns: dict[int, Conn] = {}
        self.in_flight = 0
        self.evicted = 0  # connections closed to make room (for tests and the benchmark)
        self.refused = 0  # 503s for too many requests or connections
        self._timers: dict[str, OrderedDict[Conn, None]] = {
            k: OrderedDict() for k in (HANDSHAKE, IDLE, HEAD, LINGER, WRITE)}
        self._selector = selectors.DefaultSelector()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._returns: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = False
        self._accept_paused_until = 0.0
        self._threads: list[threading.Thread] = []

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self.listener.setblocking(False)
        self._selector.register(self.listener.fileno(), selectors.EVENT_READ, None)
        self._selector.register(self._wake_r.fileno(), selectors.EVENT_READ, "wake")
        self._threads = [threading.Thread(target=self._run, name="http", daemon=True)]
        self._threads += [
            threading.Thread(target=self._work, name=f"http-worker-{i}", daemon=True) for i in range(self.limits.workers)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake()
        for _ in range(self.limits.workers):
            self._jobs.put(None)
        for thread in self._threads:
            thread.join(5)
        self._threads = []

    def close(self) -> None:
        for conn in list(self.conns.values()):
            self._close(conn)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass  # already woken (buffer full) or closing

    # --- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            try:
                events = self._selector.select(self._next_timeout())
            except OSError as exc:  # e.g. EINTR is retried by Python; anything else is logged, not fatal
                log.warning("http loop select failed: %s", exc)
                time.sleep(0.1)
                continue
            for key, mask in events:
                try:
                    self._event(key, mask)
                except Exception:  # one bad connection never stops the loop
                    log.exception("http loop error")
                    conn = key.data if isinstance(key.data, Conn) else None
                    if conn is not None:
                        self._close(conn)
            self._expire(time.monotonic())
            if self._accept_paused_until and time.monotonic() >= self._accept_paused_until:
                self._accept_paused_until = 0.0
                self._selector.register(self.listener.fileno(), selectors.EVENT_READ, None)

    def _next_timeout(self) -> float:
        now = time.monotonic()
        timeout = 1.0
        for timers in self._timers.values():
            if timers:
                timeout = min(timeout, next(iter(timers)).deadline - now)
        if self._accept_paused_until:
            timeout = min(timeout, self._accept_paused_until - now)
        return max(0.0, timeout)

    def _event(self, key: selectors.SelectorKey, mask: int) -> None:
        if key.data is None:
            self._accept()
        elif key.data == "wake":
            self._drain_wake()
        else:
            conn: Conn = key.data
            if conn.state == HANDSHAKE:
                self._handshake(conn)
            elif conn.state == WRITE:
                self._flush(conn)
            elif conn.state == LINGER:
                self._drain(conn)
            elif conn.state in (IDLE, HEAD, BODY):
                if self._fill(conn):
                    self._advance(conn)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
        while True:
            try:
                conn, keep = self._returns.get_nowait()
            except queue.Empty:
                return
            self.in_flight -= 1
            self._returned(conn, keep)

    # --- timers ------------------------------------------------------------------------------

    def _arm(self, conn: Conn, kind: str, seconds: float) -> None:
        self._disarm(conn)
        now = time.monotonic()
        conn.since, conn.deadline, conn.timer = now, now + seconds, kind
        self._timers[kind][conn] = None

    def _disarm(self, conn: Conn) -> None:
        if conn.timer is not None:
            self._timers[conn.timer].pop(conn, None)
            conn.timer = None

    def _expire(self, now: float) -> None:
        for kind, timers in self._timers.items():
            while timers:
                conn = next(iter(timers))
                if conn.deadline > now:
                    break
                if kind == HANDSHAKE and self.tls is not None:
                    self.tls.failed(conn.address, TimeoutError("TLS handshake not completed in time"))
                elif kind == HEAD:
                    log.debug("http %s: request not received in %.0f s, closing", conn.address[0],
                              self.limits.header_timeout)
                elif kind == WRITE:
                    log.debug("http client %s did not read its response in %.0f s, closing", conn.address,
                              self.limits.write_timeout)
                self._close(conn)

    def _evict_one(self) -> bool:
        """Close the connection waiting longest without a request in progress; False if there is none."""
        fronts = [next(iter(timers)) for kind, timers in self._timers.items() if timers and kind != WRITE]
        if not fronts:
            return False
        self.evicted += 1
        self._close(min(fronts, key=lambda c: c.since))
        return True

    # --- selector bookkeeping ----------------------------------------------------------------

    def _want(self, conn: Conn, events: int) -> None:
        if conn.events == events:
            return
        if conn.events == 0:
            self._selector.register(conn.fd, events, conn)
        elif events == 0:
            self._selector.unregister(conn.fd)
        else:
            self._selector.modify(conn.fd, events, conn)
        conn.events = events

    def _close(self, conn: Conn) -> None:
        if conn.state == CLOSED:
            return
        self._disarm(conn)
        if conn.events:
            try:
                self._selector.unregister(conn.fd)
            except (KeyError, ValueError):
                pass
            conn.events = 0
        self.conns.pop(conn.fd, None)
        conn.state = CLOSED
        try:
            conn.sock.close()
        except OSError:
            pass

    # --- accepting and TLS -------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM) and self._evict_one():
                    continue
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                log.warning("http accept failed (%s); pausing accepts for 0.1 s", exc)
                self._selector.unregister(self.listener.fileno())
                self._accept_paused_until = time.monotonic() + 0.1
                return
            if len(self.conns) >= self.max_connections and not self._evict_one():
                self.refused += 1
                self._refuse_new(sock)
                continue
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle delay on keep-alive scrapes
            except OSError:
                pass
            conn = Conn(sock, address)
            self.conns[conn.fd] = conn
            self._want(conn, selectors.EVENT_READ)
            if self.tls is not None:
                conn.state = HANDSHAKE
                self._arm(conn, HANDSHAKE, self.limits.tls_handshake_timeout)
            else:
                self._arm(conn, HEAD, self.limits.header_timeout)

    def _refuse_new(self, sock: socket.socket) -> None:
        """Every connection has a request in progress: a plain client gets 503, a TLS client a close."""
        try:
            if self.tls is None:
                sock.setblocking(False)
                sock.send(_busy(b"too many connections\n"))
        except OSError:
            pass
        sock.close()

    def _handshake(self, conn: Conn) -> None:
        assert self.tls is not None
        if conn.tls_settings is None:  # first bytes are in: wrap only now, so idle sockets cost no SSL object
            context, settings = self.tls.context()
            if context is None:
                self._close(conn)
                return
            try:
                conn.sock = context.wrap_socket(conn.sock, server_side=True, do_handshake_on_connect=False)
            except (OSError, ValueError) as exc:
                self.tls.failed(conn.address, exc)
                self._close(conn)
                return
            conn.tls_settings = settings
        try:
            conn.sock.do_handshake()  # type: ignore[attr-defined]
        except ssl.SSLWantReadError:
            self._want(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._want(conn, selectors.EVENT_WRITE)
            return
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError; so are resets
            self.tls.failed(conn.address, exc)
            self._close(conn)
            return
        if not self.tls.allowed(conn.tls_settings, conn.sock, conn.address):  # type: ignore[arg-type]
            self._close(conn)
            return
        conn.state = HEAD
        self._want(conn, selectors.EVENT_READ)
        self._arm(conn, HEAD, self.limits.header_timeout)
        if self._fill(conn):  # the request may have come with the last handshake flight
            self._advance(conn)

    # --- reading requests --------------------------------------------------------------------

    def _fill(self, conn: Conn) -> bool:
        """Read what is there (TLS: everything decrypted); False if the connection was closed."""
        limit = MAX_HEAD_BYTES + self.limits.max_body_bytes
        while len(conn.buf) < limit:
            try:
                data = conn.sock.recv(65536)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return True
            except OSError:  # reset, TLS alert or garbage
                self._close(conn)
                return False
            if not data:
                conn.eof = True
                self._want(conn, 0)
                return True
            conn.buf += data
        return True

    def _advance(self, conn: Conn) -> None:
        """Hand the next complete request to a worker, or wait for more bytes."""
        buf = conn.buf
        if conn.state == BODY and conn.body_end == CHUNKED:
            end, problem = chunked_end(buf, self.limits.max_body_bytes)
            if problem is None and end < 0 and len(buf) >= MAX_HEAD_BYTES + self.limits.max_body_bytes:
                problem = (413, f"Request body larger than {self.limits.max_body_bytes} bytes")
            if problem is not None:
                buf.clear()
                self._dispatch(conn, conn.head, problem, True)
            elif end >= 0:
                del buf[:end]
                self._dispatch(conn, conn.head, None, False)
            elif conn.eof:
                self._close(conn)
            return
        if conn.state == BODY:
            if len(buf) >= conn.body_end:
                del buf[:conn.body_end]
                self._dispatch(conn, conn.head, None, False)
            elif conn.eof:
                self._close(conn)
            return
        if not buf:
            if conn.eof:
                self._close(conn)
            return
        if conn.state == IDLE:  # the next request's first byte starts its deadline
            conn.state = HEAD
            self._arm(conn, HEAD, self.limits.header_timeout)
        newline = buf.find(b"\n", 0, MAX_LINE + 1)
        if newline < 0:
            if len(buf) > MAX_LINE:  # the handler answers 414
                self._dispatch(conn, bytes(buf[:MAX_LINE + 1]), None, True)
            elif conn.eof:
                self._close(conn)
            return
        words = bytes(buf[:newline]).split()
        if len(words) != 3:  # empty, HTTP/0.9 or garbage: the handler answers (or closes) at once
            head = bytes(buf[:newline + 1])
            buf.clear()
            self._dispatch(conn, head, None, True)
            return
        end = _head_end(buf, max(newline, conn.scanned))
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                self._dispatch(conn, bytes(buf[:MAX_HEAD_BYTES]), (431, "Request header fields too large"), True)
            elif conn.eof:
                self._close(conn)
            else:
                conn.scanned = max(newline, len(buf) - 2)
            return
        head = bytes(buf[:end])
        del buf[:end]
        conn.scanned = 0
        body, problem, close_after = framing(words[0], words[2], head[newline + 1:], self.limits.max_body_bytes)
        if body and not problem:
            conn.state, conn.head, conn.body_end = BODY, head, body
            self._advance(conn)
            return
        if close_after:
            buf.clear()  # whatever follows is a body nobody reads (drained while lingering)
        self._dispatch(conn, head, problem, close_after)

    def _dispatch(self, conn: Conn, head: bytes, problem: Problem | None, close_after: bool) -> None:
        if self.in_flight >= self.limits.max_requests:
            self.refused += 1
            try:
                conn.sock.send(_busy(b"too many requests in flight, try again later\n"))
            except OSError:
                pass
            self._linger(conn)
            return
        if (problem is None and not close_after and not conn.eof and not conn.buf and self.tls is None
                and self.inline is not None and self.inline(head)):
            self._serve_inline(conn, head)
            return
        self._disarm(conn)
        self._want(conn, 0)
        conn.state = BUSY
        conn.close_after = close_after or conn.eof
        self.in_flight += 1
        self._jobs.put((conn, head, problem))

    def _serve_inline(self, conn: Conn, head: bytes) -> None:
        """Answer a cheap request here; what the socket does not take at once is sent as it drains."""
        self._disarm(conn)
        conn.state, conn.close_after, conn.out = BUSY, False, bytearray()
        self.served_inline += 1
        try:
            keep = self.handle(conn, head, None, False)
        except Exception as exc:  # noqa: BLE001 - a reset while writing, or a bug: this connection ends
            if not isinstance(exc, (ConnectionError, TimeoutError)):
                log.exception("error handling a request from %s", conn.address)
            conn.out = None
            self._close(conn)
            return
        if conn.state == CLOSED:
            return
        if conn.out:
            conn.keep, conn.state = keep, WRITE
            self._arm(conn, WRITE, self.limits.write_timeout)
            self._want(conn, selectors.EVENT_WRITE)
            return
        conn.out = None
        self._returned(conn, keep)

    def _flush(self, conn: Conn) -> None:
        """Send more of an inline response; when all is gone the connection goes on as after a worker."""
        assert conn.out is not None
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            conn.out = None
            self._close(conn)
            return
        del conn.out[:sent]
        if not conn.out:
            conn.out = None
            conn.state = BUSY
            self._returned(conn, conn.keep)

    # --- after a request ---------------------------------------------------------------------

    def _returned(self, conn: Conn, keep: bool) -> None:
        if conn.state == CLOSED:
            return
        try:
            conn.sock.setblocking(False)
        except OSError:
            self._close(conn)
            return
        if self._stopping:
            self._close(conn)
        elif not keep or conn.close_after:
            self._linger(conn)
        else:
            conn.state = IDLE
            self._arm(conn, IDLE, self.limits.idle_timeout)
            self._want(conn, selectors.EVENT_READ)
            self._advance(conn)  # a pipelined request may be waiting in the buffer

    def _linger(self, conn: Conn) -> None:
        """Half-close, then read and drop what the client still sends, so it gets the response, not a reset."""
        conn.buf.clear()
        if conn.eof:
            self._close(conn)
            return
        try:
            conn.sock.setblocking(False)
            conn.sock.shutdown(socket.SHUT_WR)
        except (OSError, ValueError):
            self._close(conn)
            return
        conn.state = LINGER
        self._arm(conn, LINGER, LINGER_SECONDS)
        self._want(conn, selectors.EVENT_READ)
        self._drain(conn)

    def _drain(self, conn: Conn) -> None:
        for _ in range(16):
            try:
                if not conn.sock.recv(65536):
                    break
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except (OSError, ValueError):
                break
        else:
            return
        self._close(conn)

    # --- workers -----------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            conn, head, problem = job
            keep = False
            try:
                conn.sock.settimeout(self.limits.write_timeout)
                keep = self.handle(conn, head, problem, conn.close_after)
            except (ConnectionError, TimeoutError) as exc:
                log.debug("http client %s went away: %r", conn.address, exc)
            except Exception:
                log.exception("error handling a request from %s", conn.address)
            self._returns.put((conn, keep))
            self._wake()
