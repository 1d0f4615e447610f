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

import hashlib
import logging
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from gpuperfd.config import ConfigError

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
BCRYPT_HASH = re.compile(r"^\$2[aby]?\$(\d\d)\$[./A-Za-z0-9]{53}$")


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
    #: the file says ``basic_auth_users: {}`` in so many words: the only way a reload may turn auth off.
    auth_off_stated: bool = False
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


def files_fingerprint(files: tuple[Path, ...], read: Mapping[Path, bytes] | None = None) -> str:
    """SHA-256 over the contents of ``files``; an unreadable file counts by its error, never raises.

    ``read`` gives contents already read (the config file as parsed), so the
    fingerprint is of what was loaded even if the file changed just after.
    """
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path).encode() + b"\0")
        try:
            content = read[path] if read and path in read else path.read_bytes()
            digest.update(hashlib.sha256(content).digest())
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
        match = BCRYPT_HASH.match(text)
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
    valid and turns nothing on (at start; on reload :class:`WebConfigWatcher`
    keeps basic auth on unless the file says ``basic_auth_users: {}``).
    """
    path = Path(path)
    from gpuperfd.config.strict_yaml import read_bounded

    try:
        raw = read_bounded(path)
    except ValueError as exc:
        raise _fail(path, "", str(exc)) from None
    except FileNotFoundError:
        raise _fail(path, "", "web config file not found") from None
    except OSError as exc:
        raise _fail(path, "", f"cannot read web config file: {exc}") from None
    from gpuperfd.config.strict_yaml import DuplicateKeyError, safe_load_strict

    try:
        data = safe_load_strict(raw)
    except DuplicateKeyError as exc:
        raise _fail(path, "", str(exc.problem)) from None
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
        fingerprint=files_fingerprint(files, {path: raw}),
        auth_off_stated=isinstance(data.get("basic_auth_users"), dict) and not data["basic_auth_users"],
        _context=context,
    )


