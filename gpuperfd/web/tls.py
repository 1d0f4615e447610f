"""TLS for the HTTP endpoint: the SSLContext from a web config, and per-connection handshakes
in the connection's own thread so a slow client never holds up the accept loop."""

from __future__ import annotations

import ipaddress
import logging
import socket
import socketserver
import threading
import time
from typing import Any

from gpuperfd.web.config import WebSecurity
from gpuperfd.web.watcher import SecurityProvider, WebConfigWatcher, as_provider

log = logging.getLogger(__name__)

def peer_sans(peer_cert: dict) -> list[str]:
    """The SAN values (DNS, IP, e-mail, URI) of a certificate as returned by SSLSocket.getpeercert()."""
    values = []
    for kind, value in peer_cert.get("subjectAltName", ()):
        if kind == "IP Address":
            try:  # OpenSSL writes IPv6 uncompressed and in capitals
                value = str(ipaddress.ip_address(value.strip()))
            except ValueError:
                pass
        values.append(value)
    return values


def _san_allowed(sans: list[str], allowed: tuple[str, ...]) -> bool:
    normalized = set()
    for entry in allowed:
        try:
            normalized.add(str(ipaddress.ip_address(entry)))
        except ValueError:
            normalized.add(entry)
    return any(value in normalized for value in sans)


class _RateLimitedLog:
    """Logs the first failure at warning, then at debug for ``quiet_seconds``."""

    def __init__(self, quiet_seconds: float = 60.0) -> None:
        self.quiet_seconds = quiet_seconds
        self._until = 0.0
        self._lock = threading.Lock()

    def __call__(self, message: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            loud = now >= self._until
            if loud:
                self._until = now + self.quiet_seconds
        if loud:
            log.warning(message + " (more in the next %.0f s are logged at debug level)", *args, self.quiet_seconds)
        else:
            log.debug(message, *args)


class TlsServerMixin:
    """For a threading socketserver: TLS on each accepted connection, handshake in the connection's thread.

    The accept loop only accepts; the new connection's thread takes the
    SSLContext current at that moment (so renewed certificates and CAs apply to
    new connections), does the handshake with a timeout, checks
    ``client_allowed_sans``, and only then builds the request handler. A client
    that stalls or fails the handshake holds up nobody else.
    """

    tls_handshake_timeout: float = 10.0
    web_security: SecurityProvider
    _tls_failure_log = _RateLimitedLog()

    def process_request_thread(self, request: socket.socket, client_address: Any) -> None:
        security = self.web_security()
        context = security.ssl_context()
        if context is None:  # cannot happen while TLS on/off is fixed; serve plain rather than crash
            super().process_request_thread(request, client_address)  # type: ignore[misc]
            return
        try:
            request.settimeout(self.tls_handshake_timeout)
            tls_socket = context.wrap_socket(request, server_side=True)  # handshake happens here
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError; timeouts too
            self._tls_failure_log("TLS handshake with %s failed: %s", client_address[0], exc)
            self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        allowed = security.tls.client_allowed_sans if security.tls else ()
        if allowed:
            sans = peer_sans(tls_socket.getpeercert() or {})
            if not _san_allowed(sans, allowed):
                self._tls_failure_log(
                    "client %s rejected: certificate SANs %s not in client_allowed_sans", client_address[0], sans
                )
                self.shutdown_request(tls_socket)  # type: ignore[attr-defined]
                return
        super().process_request_thread(tls_socket, client_address)  # type: ignore[misc]


def wrap_server_for_tls(
    server: socketserver.TCPServer, security: WebConfigWatcher | WebSecurity | SecurityProvider
) -> None:
    """Make a running-or-not threading TCP server speak TLS per connection (see :class:`TlsServerMixin`).

    Works on the server instance (its class is swapped for a subclass with the
    mixin), so :class:`gpuperfd.web.WebServer` needs no change. Call it before
    ``start()``.
    """
    if not isinstance(server, socketserver.ThreadingMixIn):
        raise TypeError("TLS handshakes run in per-connection threads: the server must use ThreadingMixIn")
    if not isinstance(server, TlsServerMixin):
        cls = type(server)
        server.__class__ = type(f"Tls{cls.__name__}", (TlsServerMixin, cls), {})
    server.web_security = as_provider(security)  # type: ignore[attr-defined]


