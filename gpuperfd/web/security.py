"""Applies a web config to a :class:`~gpuperfd.web.server.WebServer`: basic auth, response
headers, and TLS when configured."""

from __future__ import annotations

from gpuperfd.web.auth import BasicAuthGate
from gpuperfd.web.config import WebSecurity
from gpuperfd.web.server import WebServer
from gpuperfd.web.tls import wrap_server_for_tls
from gpuperfd.web.watcher import SecurityProvider, WebConfigWatcher, as_provider


def add_response_headers(
    server: WebServer, security: WebConfigWatcher | WebSecurity | SecurityProvider
) -> None:
    """Add ``http_server_config.headers`` (as current per request) to every response the server sends."""
    provider = as_provider(security)
    base = server.RequestHandlerClass

    class SecurityHeadersHandler(base):  # type: ignore[misc, valid-type]
        def end_headers(self) -> None:
            for name, value in provider().headers.items():
                self.send_header(name, value)
            super().end_headers()

    SecurityHeadersHandler.__name__ = SecurityHeadersHandler.__qualname__ = f"SecurityHeaders{base.__name__}"
    server.RequestHandlerClass = SecurityHeadersHandler


def secure_web_server(
    web: WebServer,
    watcher: WebConfigWatcher,
    *,
    open_paths: frozenset[str] | set[str] = frozenset(),
) -> BasicAuthGate:
    """Apply a web config to a WebServer before ``start()``: basic auth, headers, and TLS if configured.

    ``open_paths`` are served without basic auth (e.g. ``{"/healthz"}`` for
    probes that cannot send credentials); TLS, when on, still applies to them.
    Returns the gate (its ``bcrypt_calls`` counter is handy in tests).
    """
    gate = BasicAuthGate(watcher, open_paths=open_paths)
    web.gate = gate
    add_response_headers(web, watcher)
    if watcher.tls_enabled:
        wrap_server_for_tls(web, watcher)
    return gate
