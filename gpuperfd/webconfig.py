"""TLS, basic auth and security headers for the HTTP endpoint, from an exporter-toolkit web config.

``--web.config.file`` (``web.config_file`` in the YAML config) names a file in
the format every Prometheus exporter reads (exporter-toolkit's
docs/web-configuration.md), so one file can serve node_exporter and gpuperfd::

    tls_server_config:
      cert_file: server.crt            # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: clients-ca.crt
      min_version: TLS12
    http_server_config:
      headers: {X-Content-Type-Options: nosniff}
    basic_auth_users:
      prometheus: $2b$10$...           # bcrypt hash

Where it sits: the daemon builds a :class:`WebConfigWatcher` from the file
(an invalid file fails the start with :class:`WebConfigError`, exit code 2) and
hands it to :func:`secure_web_server`, which puts three things on the
:class:`gpuperfd.web.WebServer`:

* a :class:`BasicAuthGate` (the server's RequestGate): 401 without valid
  credentials; bcrypt results are cached so many scrapers do not each pay bcrypt;
* response headers from ``http_server_config.headers`` on every response;
* TLS (:func:`wrap_server_for_tls`): each accepted connection is wrapped with the
  SSLContext current at that moment and the handshake runs in the connection's
  own thread, so a slow or hostile client never holds up the accept loop.

The watcher re-reads the file, and the certificate, key and CA files it names,
at most once a second when requests arrive (and at once on :meth:`reload`, for
SIGHUP). New users, passwords and certificates apply to the next request or
connection without a restart; a file that does not load is logged and the old
settings stay. Turning TLS on or off needs a restart (the listening socket's
scheme cannot change under connected clients), as with exporter-toolkit.

Differences from exporter-toolkit (Go's crypto/tls) forced by Python's ssl module:
``cipher_suites``, ``curve_preferences``, ``http2`` and ``rate_limit`` are
ignored (with a warning for the first three that change security); inline
``cert``/``key`` are not supported; ``RequestClientCert`` does not ask for a
certificate (Go asks but never checks it, so either way any client gets in);
``RequireAnyClientCert`` (a certificate without verification) cannot be had, so
it verifies against ``client_ca_file`` like RequireAndVerifyClientCert and is
an error without one; a verifying mode without ``client_ca_file`` is an error
rather than a check against the system's public CAs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import logging
import re
import secrets
import socket
import socketserver
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from gpuperfd.config import ConfigError
from gpuperfd.web import RequestGate, Response, WebServer

log = logging.getLogger(__name__)

CLIENT_AUTH_TYPES = (
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
)
#: exporter-toolkit's old spelling of RequireAnyClientCert, still accepted there.
_CLIENT_AUTH_ALIASES = {"RequireClientCert": "RequireAnyClientCert", "": "NoClientCert"}
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
#: The headers exporter-toolkit lets a web config set, with their allowed values (None: any).
ALLOWED_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
REALM = "gpuperfd"
_TLS_KEYS = {
    "cert_file", "key_file", "client_auth_type", "client_ca_file", "client_allowed_sans", "min_version",
    "max_version", "cipher_suites", "prefer_server_cipher_suites", "curve_preferences", "cert", "key", "client_ca",
}
_BCRYPT_HASH = re.compile(r"^\$2[aby]?\$(\d\d)\$[./A-Za-z0-9]{53}$")


class WebConfigError(ConfigError):
    """A web config file that cannot be used; the message names the file and the field."""


def _fail(path: Path, where: str, message: str) -> WebConfigError:
    return WebConfigError(f"{path}: {where}: {message}" if where else f"{path}: {message}")


@dataclass(frozen=True)
class TlsSettings:
    """``tls_server_config``, with paths made absolute."""

    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    client_allowed_sans: tuple[str, ...] = ()
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
    prefer_server_cipher_suites: bool = True


@dataclass(frozen=True, eq=False)
class WebSecurity:
    """One loaded web config: what the server enforces until the file changes."""

    source: Path | None = None
    tls: TlsSettings | None = None
    #: user name -> bcrypt hash; empty: no basic auth.
    users: Mapping[str, bytes] = field(default_factory=lambda: MappingProxyType({}))
    #: headers added to every response.
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: every file whose content these settings came from (the config, certificate, key, CA).
    files: tuple[Path, ...] = ()
    #: hash of those files' contents when loaded (see :func:`files_fingerprint`).
    fingerprint: str = ""
    _context: ssl.SSLContext | None = field(default=None, repr=False)

    @property
    def auth_required(self) -> bool:
        return bool(self.users)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server SSLContext built from ``tls_server_config``; None when TLS is off."""
        return self._context

    def describe(self) -> str:
        """One line for the log: what is on."""
        parts = [f"TLS {'on' if self.tls else 'off'}"]
        if self.tls:
            parts.append(f"client auth {self.tls.client_auth_type}")
        parts.append(f"basic auth {'for ' + str(len(self.users)) + ' user(s)' if self.users else 'off'}")
        if self.headers:
            parts.append(f"headers {', '.join(sorted(self.headers))}")
        return ", ".join(parts)


def files_fingerprint(files: tuple[Path, ...]) -> str:
    """SHA-256 over the contents of ``files``; an unreadable file counts by its error, never raises."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path).encode() + b"\0")
        try:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        except OSError as exc:
            digest.update(f"error:{type(exc).__name__}:{exc.errno}".encode())
    return digest.hexdigest()


def _mapping(value: Any, path: Path, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(path, where, f"must be a mapping, got {type(value).__name__}")
    return value


def _string(value: Any, path: Path, where: str) -> str:
    if not isinstance(value, str):
        raise _fail(path, where, f"must be a string, got {type(value).__name__}")
    return value


def _file(value: Any, path: Path, where: str) -> Path:
    text = _string(value, path, where)
    if not text:
        raise _fail(path, where, "must not be empty")
    result = Path(text)
    if not result.is_absolute():  # exporter-toolkit resolves relative to the config file's folder
        result = path.parent / result
    if not result.is_file():
        raise _fail(path, where, f"file {str(result)!r} does not exist or is not a file")
    return result


def _parse_tls(data: dict, path: Path) -> TlsSettings | None:
    unknown = sorted(set(data) - _TLS_KEYS)
    if unknown:
        raise _fail(path, "tls_server_config", f"unknown field(s) {', '.join(unknown)}")
    for inline in ("cert", "key", "client_ca"):
        if inline in data:
            raise _fail(
                path, f"tls_server_config.{inline}",
                f"inline PEM is not supported by gpuperfd; put it in a file and use {inline}_file",
            )
    for ignored in ("cipher_suites", "curve_preferences"):
        if data.get(ignored):
            log.warning("%s: tls_server_config.%s is ignored: gpuperfd uses OpenSSL's defaults", path, ignored)
    if not any(data.get(key) for key in ("cert_file", "key_file", "client_ca_file", "client_auth_type")):
        return None  # like exporter-toolkit: no TLS field set means plain HTTP
    for required in ("cert_file", "key_file"):
        if not data.get(required):
            raise _fail(path, f"tls_server_config.{required}", "missing (required when TLS is configured)")
    cert_file = _file(data["cert_file"], path, "tls_server_config.cert_file")
    key_file = _file(data["key_file"], path, "tls_server_config.key_file")
    auth = _string(data.get("client_auth_type") or "NoClientCert", path, "tls_server_config.client_auth_type")
    auth = _CLIENT_AUTH_ALIASES.get(auth, auth)
    if auth not in CLIENT_AUTH_TYPES:
        raise _fail(
            path, "tls_server_config.client_auth_type",
            f"unknown value {auth!r}; expected one of {', '.join(CLIENT_AUTH_TYPES)}",
        )
    ca_file = None
    if data.get("client_ca_file"):
        ca_file = _file(data["client_ca_file"], path, "tls_server_config.client_ca_file")
    if ca_file is not None and auth == "NoClientCert":
        raise _fail(
            path, "tls_server_config.client_ca_file",
            "set without a client_auth_type that checks certificates (e.g. RequireAndVerifyClientCert)",
        )
    if auth in ("RequireAnyClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert") and ca_file is None:
        raise _fail(
            path, "tls_server_config.client_ca_file",
            f"required with client_auth_type {auth}: client certificates are verified against it",
        )
    if auth == "RequireAnyClientCert":
        log.warning(
            "%s: client_auth_type RequireAnyClientCert: Python's ssl cannot accept unverified client certificates, "
            "so they are verified against client_ca_file (as RequireAndVerifyClientCert)", path,
        )
    sans_raw = data.get("client_allowed_sans") or []
    if not isinstance(sans_raw, list) or not all(isinstance(s, str) for s in sans_raw):
        raise _fail(path, "tls_server_config.client_allowed_sans", "must be a list of strings")
    if sans_raw and auth not in ("RequireAnyClientCert", "RequireAndVerifyClientCert"):
        raise _fail(
            path, "tls_server_config.client_allowed_sans",
            "needs client_auth_type RequireAnyClientCert or RequireAndVerifyClientCert (a client must present a certificate)",
        )
    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        name = _string(data.get(key) or default, path, f"tls_server_config.{key}")
        if name not in TLS_VERSIONS:
            raise _fail(path, f"tls_server_config.{key}", f"unknown TLS version {name!r}; expected one of {', '.join(TLS_VERSIONS)}")
        versions[key] = TLS_VERSIONS[name]
    if versions["min_version"] > versions["max_version"]:
        raise _fail(path, "tls_server_config.min_version", "is above max_version")
    prefer = data.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise _fail(path, "tls_server_config.prefer_server_cipher_suites", "must be true or false")
    return TlsSettings(
        cert_file=cert_file,
        key_file=key_file,
        client_auth_type=auth,
        client_ca_file=ca_file,
        client_allowed_sans=tuple(sans_raw),
        min_version=versions["min_version"],
        max_version=versions["max_version"],
        prefer_server_cipher_suites=prefer,
    )


def build_ssl_context(tls: TlsSettings, path: Path | None = None) -> ssl.SSLContext:
    """A server SSLContext for ``tls``; WebConfigError if the certificate, key or CA do not load."""
    source = path or Path("<web config>")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.minimum_version = tls.min_version
        context.maximum_version = tls.max_version
    except ValueError as exc:  # e.g. a version this OpenSSL build lacks
        raise _fail(source, "tls_server_config.min_version", f"not usable with this OpenSSL: {exc}") from None
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except ssl.SSLError as exc:
        raise _fail(
            source, "tls_server_config.cert_file",
            f"cannot load certificate {str(tls.cert_file)!r} with key {str(tls.key_file)!r}: {exc.reason or exc} "
            "(PEM files expected; the key must match the certificate and have no passphrase)",
        ) from None
    except OSError as exc:
        raise _fail(source, "tls_server_config.cert_file", f"cannot read certificate or key: {exc}") from None
    if tls.client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=tls.client_ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise _fail(
                source, "tls_server_config.client_ca_file",
                f"cannot load CA certificates from {str(tls.client_ca_file)!r}: {getattr(exc, 'reason', None) or exc}",
            ) from None
    context.verify_mode = {
        "NoClientCert": ssl.CERT_NONE,
        "RequestClientCert": ssl.CERT_NONE,
        "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
        "RequireAnyClientCert": ssl.CERT_REQUIRED,
        "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
    }[tls.client_auth_type]
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    return context


def _parse_users(data: Any, path: Path) -> dict[str, bytes]:
    users: dict[str, bytes] = {}
    for name, hashed in _mapping(data, path, "basic_auth_users").items():
        if isinstance(name, (int, float)) and not isinstance(name, bool):
            name = str(name)  # YAML reads `123:` as a number; Go reads it as the string "123"
        where = f"basic_auth_users.{name}"
        if not isinstance(name, str) or not name:
            raise _fail(path, "basic_auth_users", f"user names must be non-empty strings, got {name!r}")
        if ":" in name:
            raise _fail(path, where, "a user name cannot contain ':' (basic auth separates user and password with it)")
        text = _string(hashed, path, where)
        match = _BCRYPT_HASH.match(text)
        if not match or not 4 <= int(match.group(1)) <= 31:
            raise _fail(
                path, where,
                "is not a bcrypt hash ($2b$<cost>$ followed by 53 characters; make one with "
                "`htpasswd -nBC 10 \"\" | tr -d ':\\n'` or python -c 'import bcrypt; print(bcrypt.hashpw(b\"PASSWORD\", "
                "bcrypt.gensalt()).decode())')",
            )
        users[name] = text.encode("ascii")
    return users


def _parse_http(data: Any, path: Path) -> dict[str, str]:
    data = _mapping(data, path, "http_server_config")
    unknown = sorted(set(data) - {"http2", "headers"})
    if unknown:
        raise _fail(path, "http_server_config", f"unknown field(s) {', '.join(unknown)}")
    if "http2" in data and not isinstance(data["http2"], bool):
        raise _fail(path, "http_server_config.http2", "must be true or false")
    headers: dict[str, str] = {}
    for name, value in _mapping(data.get("headers"), path, "http_server_config.headers").items():
        where = f"http_server_config.headers.{name}"
        if name not in ALLOWED_HEADERS:
            raise _fail(path, where, f"this header cannot be configured; allowed: {', '.join(ALLOWED_HEADERS)}")
        value = _string(value, path, where)
        allowed = ALLOWED_HEADERS[name]
        if allowed is not None and value not in allowed:
            raise _fail(path, where, f"invalid value {value!r}; expected one of {', '.join(allowed)}")
        if "\r" in value or "\n" in value:
            raise _fail(path, where, "must be a single line")
        if value:  # blank means unset, as in exporter-toolkit
            headers[name] = value
    return headers


def load_web_config(path: Path | str) -> WebSecurity:
    """Read and validate a web config file, building its SSLContext.

    Raises :class:`WebConfigError` naming the file and the field for anything
    that would not work: unknown fields, a missing or mismatched certificate or
    key, an unknown client_auth_type or TLS version, a password that is not a
    bcrypt hash, a header exporter-toolkit does not allow. An empty file is
    valid and turns nothing on.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise _fail(path, "", "web config file not found") from None
    except OSError as exc:
        raise _fail(path, "", f"cannot read web config file: {exc}") from None
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise _fail(path, "", f"not valid YAML: {exc}") from None
    data = _mapping(data, path, "(top level)")
    unknown = sorted(set(data) - {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"})
    if unknown:
        raise _fail(path, "(top level)", f"unknown field(s) {', '.join(map(str, unknown))}")
    if data.get("rate_limit"):
        log.warning("%s: rate_limit is ignored by gpuperfd", path)
    tls = _parse_tls(_mapping(data.get("tls_server_config"), path, "tls_server_config"), path)
    headers = _parse_http(data.get("http_server_config"), path)
    users = _parse_users(data.get("basic_auth_users"), path)
    context = build_ssl_context(tls, path) if tls is not None else None
    if users and tls is None:
        log.warning("%s: basic auth without TLS: passwords cross the network in clear text", path)
    files = (path,) + tuple(
        p for p in ((tls.cert_file, tls.key_file, tls.client_ca_file) if tls else ()) if p is not None
    )
    return WebSecurity(
        source=path,
        tls=tls,
        users=MappingProxyType(users),
        headers=MappingProxyType(headers),
        files=files,
        fingerprint=files_fingerprint(files),
        _context=context,
    )


class WebConfigWatcher:
    """The current :class:`WebSecurity` of one file, re-read when the file or its certificates change.

    :meth:`current` is called on every request and connection; at most once per
    ``check_interval`` seconds it hashes the files (a few KiB) and, if anything
    changed, loads them anew. A file that fails to load is logged once (per
    content) and the previous settings stay in force.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        check_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.check_interval = check_interval
        self._clock = clock
        self._security = load_web_config(self.path)  # an invalid file at start is fatal (exit 2)
        self._lock = threading.Lock()
        self._next_check = clock() + check_interval
        self._rejected: str | None = None  # fingerprint of content that failed, not to log it every second
        log.info("web config %s: %s", self.path, self._security.describe())

    @property
    def tls_enabled(self) -> bool:
        """Whether the server speaks TLS; fixed for the life of the process."""
        return self._security.tls is not None

    def current(self) -> WebSecurity:
        """The settings to apply now (cheap: one clock read between checks)."""
        if self._clock() >= self._next_check:
            with self._lock:
                now = self._clock()
                if now >= self._next_check:
                    self._next_check = now + self.check_interval
                    self._refresh(force=False)
        return self._security

    def reload(self) -> bool:
        """Re-read now (SIGHUP); True if new settings took effect."""
        with self._lock:
            self._next_check = self._clock() + self.check_interval
            return self._refresh(force=True)

    def _refresh(self, force: bool) -> bool:
        old = self._security
        fingerprint = files_fingerprint(old.files)
        if fingerprint == old.fingerprint and not force:
            return False
        if fingerprint == self._rejected and not force:
            return False
        try:
            new = load_web_config(self.path)
        except WebConfigError as exc:
            self._rejected = fingerprint
            log.error("web config not reloaded, keeping the previous settings: %s", exc)
            return False
        if (new.tls is None) != (old.tls is None):
            self._rejected = fingerprint
            log.error(
                "web config %s not reloaded, keeping the previous settings: it turns TLS %s, which needs a restart",
                self.path, "on" if new.tls else "off",
            )
            return False
        self._rejected = None
        self._security = new
        if new.fingerprint != old.fingerprint:
            log.info("web config %s reloaded: %s", self.path, new.describe())
        return new.fingerprint != old.fingerprint


SecurityProvider = Callable[[], WebSecurity]


def _as_provider(source: WebConfigWatcher | WebSecurity | SecurityProvider) -> SecurityProvider:
    if isinstance(source, WebConfigWatcher):
        return source.current
    if isinstance(source, WebSecurity):
        return lambda: source
    return source


def parse_basic_auth(header: str | None) -> tuple[str, bytes] | None:
    """(user, password) from an ``Authorization: Basic`` header; None if absent or malformed."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


@lru_cache(maxsize=8)
def _decoy_hash(cost: int) -> bytes:
    """A bcrypt hash of a random password, checked for unknown users so that timing does not reveal them."""
    import bcrypt

    return bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(rounds=cost))


def _bcrypt_check(password: bytes, hashed: bytes) -> bool:
    import bcrypt

    try:  # bcrypt uses only the first 72 bytes; bcrypt>=5 refuses longer input instead
        return bcrypt.checkpw(password[:72], hashed)
    except ValueError:
        return False


def _unauthorized() -> Response:
    return Response(401, b"Unauthorized\n", headers={"WWW-Authenticate": f'Basic realm="{REALM}"'})


class BasicAuthGate(RequestGate):
    """401 unless the request carries a user and password from ``basic_auth_users``.

    bcrypt is slow on purpose (tens of milliseconds at cost 10), so results are
    cached, keyed by a keyed hash of user, stored hash and password: the first
    scrape with a password pays bcrypt, the rest hit the cache; changing a
    password in the file changes the stored hash, so old entries stop matching.
    bcrypt itself runs one at a time (like exporter-toolkit), so a burst of
    scrapers with a new password costs one bcrypt, not one per thread. Unknown
    users are checked against a decoy hash so their timing matches known ones.
    """

    def __init__(
        self,
        security: WebConfigWatcher | WebSecurity | SecurityProvider,
        *,
        open_paths: frozenset[str] | set[str] = frozenset(),
        cache_size: int = 256,
    ) -> None:
        self._security = _as_provider(security)
        self.open_paths = frozenset(open_paths)
        self._cache: OrderedDict[bytes, bool] = OrderedDict()
        self._cache_size = cache_size
        self._cache_lock = threading.Lock()
        self._bcrypt_lock = threading.Lock()
        self._key = secrets.token_bytes(32)
        self.bcrypt_calls = 0  # for tests and debugging

    def check(self, handler: BaseHTTPRequestHandler) -> Response | None:
        security = self._security()
        if not security.users:
            return None
        if self.open_paths and handler.path.split("?", 1)[0] in self.open_paths:
            return None
        credentials = parse_basic_auth(handler.headers.get("Authorization"))
        if credentials is not None and self.verify(security, *credentials):
            return None
        return _unauthorized()

    def verify(self, security: WebSecurity, user: str, password: bytes) -> bool:
        """Whether ``password`` is right for ``user`` under ``security`` (cached)."""
        hashed = security.users.get(user)
        known = hashed is not None
        if hashed is None:
            match = _BCRYPT_HASH.match(next(iter(security.users.values())).decode()) if security.users else None
            hashed = _decoy_hash(int(match.group(1)) if match else 10)
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in (user.encode("utf-8"), hashed, password):
            mac.update(len(part).to_bytes(4, "big") + part)
        key = mac.digest()
        cached = self._cached(key)
        if cached is None:
            with self._bcrypt_lock:
                cached = self._cached(key)  # another thread may have just computed it
                if cached is None:
                    self.bcrypt_calls += 1
                    cached = _bcrypt_check(password, hashed) and known
                    with self._cache_lock:
                        self._cache[key] = cached
                        while len(self._cache) > self._cache_size:
                            self._cache.popitem(last=False)
        return cached and known

    def _cached(self, key: bytes) -> bool | None:
        with self._cache_lock:
            value = self._cache.get(key)
            if value is not None:
                self._cache.move_to_end(key)
            return value


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
    server.web_security = _as_provider(security)  # type: ignore[attr-defined]


def add_response_headers(
    server: socketserver.BaseServer, security: WebConfigWatcher | WebSecurity | SecurityProvider
) -> None:
    """Add ``http_server_config.headers`` (as current per request) to every response the server sends."""
    provider = _as_provider(security)
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
    add_response_headers(web.server, watcher)
    if watcher.tls_enabled:
        wrap_server_for_tls(web.server, watcher)
    return gate
