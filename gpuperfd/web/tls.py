"""TLS for the HTTP endpoint: the SSLContext from a web config for each new connection, client
SAN checks, and logging of failed handshakes (which run non-blocking in the connection loop)."""

from __future__ import annotations

import ipaddress
import logging
import ssl
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


class TlsHandshakes:
    """TLS for :class:`gpuperfd.web.connections.ConnectionLoop`: the SSLContext current when a
    client's first bytes arrive (so renewed certificates and CAs apply to new connections), the
    ``client_allowed_sans`` check after the handshake, and rate-limited logging of failures.

    The handshake itself runs non-blocking in the connection loop under its own
    deadline, so a client that stalls or fails it holds up nobody and costs no thread.
    """

    _failure_log = _RateLimitedLog()

    def __init__(self, security: SecurityProvider) -> None:
        self.security = security

    def context(self) -> tuple[ssl.SSLContext | None, WebSecurity]:
        settings = self.security()
        return settings.ssl_context(), settings

    def allowed(self, settings: WebSecurity, sock: ssl.SSLSocket, address: Any) -> bool:
        allowed = settings.tls.client_allowed_sans if settings.tls else ()
        if not allowed:
            return True
        sans = peer_sans(sock.getpeercert() or {})
        if _san_allowed(sans, allowed):
            return True
        self._failure_log("client %s rejected: certificate SANs %s not in client_allowed_sans", address[0], sans)
        return False

    def failed(self, address: Any, exc: BaseException) -> None:
        self._failure_log("TLS handshake with %s failed: %s", address[0], exc)


def wrap_server_for_tls(server: Any, security: WebConfigWatcher | WebSecurity | SecurityProvider) -> None:
    """Make a :class:`gpuperfd.web.server.WebServer` speak TLS on every connection; call before ``start()``."""
    server.tls = TlsHandshakes(as_provider(security))
