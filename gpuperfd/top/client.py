"""Where ``gpuperfd top`` gets its frames: the running daemon over HTTP, or the GPUs read here.

The daemon source asks ``GET /api/v1/gpus`` (:mod:`gpuperfd.web.status`) at the daemon's own address,
scheme and credentials (its config's ``web.listen_address`` and web config file; ``--url`` overrides);
it never opens NVML itself, so the view costs the node no second NVML client. The local source
(``--local``, or ``--simulate N``) reads each GPU once per frame through the same collectors and
builds the same JSON shape; the device layer's errors (no driver) come through unchanged.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol

from gpuperfd.config import Config, parse_listen_address
from gpuperfd.web.status import SCHEMA

#: The endpoint the daemon serves the frames at.
API_PATH = "/api/v1/gpus"
#: Environment variable holding the basic-auth password (never a command-line argument: ps shows those).
PASSWORD_ENV = "GPUPERFD_PASSWORD"
FALLBACK = "read the GPUs here instead with --local (or --simulate N for simulated GPUs)"
#: The most bytes of an answer read: a frame of 64 GPUs is tens of KiB; a larger answer is not a frame.
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class TopError(Exception):
    """A frame could not be had; the message says why and what to do."""


class DaemonUnreachable(TopError):
    """Nothing answers at the daemon's address."""


class Source(Protocol):
    #: What the header says the frames come from.
    description: str

    def fetch(self) -> dict[str, Any]:
        """One frame's data in the shape of ``GET /api/v1/gpus``; raises :class:`TopError`."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class DaemonAddress:
    url: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    user: str | None = None


def daemon_url(config: Config) -> str:
    """The daemon's base URL from its config: a wildcard listen address is asked on loopback, and
    the scheme is https when its web config turns TLS on."""
    host, port = parse_listen_address(config.web.listen_address)
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    scheme = "http"
    if config.web.config_file is not None:
        from gpuperfd.web.config import WebConfigError, load_web_config

        try:
            scheme = "https" if load_web_config(config.web.config_file).tls is not None else "http"
        except (WebConfigError, OSError) as exc:
            raise TopError(f"cannot read the daemon's web config {config.web.config_file}: {exc}") from None
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def check_url(url: str) -> None:
    """TopError unless ``url`` is an http(s) URL with a host: urllib would otherwise try FTP or a file,
    or raise its own ValueError with no word of which flag was wrong."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError on a port that is not a number)
    except ValueError as exc:
        raise TopError(f"--url {url!r} is not a URL ({exc}); e.g. http://127.0.0.1:10187") from None
    if parts.scheme not in ("http", "https"):
        raise TopError(f"--url {url!r}: the daemon speaks http or https, not "
                       f"{parts.scheme + '://' if parts.scheme else 'a URL without a scheme'}; e.g. http://127.0.0.1:10187")
    if not parts.hostname:
        raise TopError(f"--url {url!r} names no host; e.g. http://127.0.0.1:10187")


#: The daemon's own pages: a ``--url`` copied from a browser or a scrape config with one of them is the
#: daemon's base URL plus that page (issue 61: ``--url http://HOST:PORT/metrics`` was told the daemon
#: "does not serve /api/v1/gpus").
DAEMON_PAGES = ("/metrics", API_PATH, "/api/v1/health", "/healthz")


def base_url(url: str) -> str:
    """``url`` without a trailing slash or one of the daemon's own pages (:data:`DAEMON_PAGES`); any
    other path stays (a reverse proxy's prefix)."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path.rstrip("/")
    for page in DAEMON_PAGES:
        if path.endswith(page):
            path = path[: -len(page)]
            break
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path.rstrip("/"), "", ""))


class DaemonSource:
    """Frames from a running daemon's ``/api/v1/gpus``."""

    def __init__(self, address: DaemonAddress, timeout_seconds: float = 5.0) -> None:
        check_url(address.url)
        self.address = address = DaemonAddress(base_url(address.url), *dataclasses.astuple(address)[1:])
        self.url = address.url + API_PATH
        self.timeout = timeout_seconds
        self.description = f"daemon {address.url}"
        context = None
        if self.url.startswith("https:"):
            context = ssl.create_default_context(cafile=address.ca_file)
            if address.cert_file:
                context.load_cert_chain(address.cert_file, address.key_file)
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),  # the node itself: no proxy
                                                   urllib.request.HTTPSHandler(context=context))
        self._headers = {"Accept": "application/json"}
        if address.user is not None:
            password = os.environ.get(PASSWORD_ENV)
            if password is None:
                raise TopError(f"--user {address.user}: set the password in ${PASSWORD_ENV}")
            token = base64.b64encode(f"{address.user}:{password}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"

    def fetch(self) -> dict[str, Any]:
        request = urllib.request.Request(self.url, headers=self._headers)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                body = response.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise TopError(self._http_error(exc.code)) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLError):
                raise TopError(f"TLS with the daemon at {self.address.url} failed: {exc.reason} "
                               "(--ca-file CA to trust its certificate; --cert/--key for a client certificate)") from None
            raise DaemonUnreachable(f"no gpuperfd daemon answers at {self.address.url} ({exc.reason}); start one "
                                    f"(gpuperfd run), point --url at it, or {FALLBACK}") from None
        except (TimeoutError, OSError) as exc:
            raise DaemonUnreachable(f"no gpuperfd daemon answers at {self.address.url} ({exc}); {FALLBACK}") from None
        except (http.client.HTTPException, ValueError) as exc:  # its bytes are not echoed: they may be anything
            raise TopError(f"{self.address.url} did not answer HTTP ({type(exc).__name__}): is a gpuperfd daemon "
                           "listening there?") from None
        if len(body) > MAX_ANSWER_BYTES:
            raise TopError(f"{self.url} answered more than {MAX_ANSWER_BYTES // 2**20} MiB: not a gpuperfd frame")
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            raise TopError(f"{self.url} did not answer JSON: is a gpuperfd daemon listening there?") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("gpus"), list):
            raise TopError(f"{self.url} answered an unknown shape (expected {SCHEMA}): a different gpuperfd version?")
        return data

    def _http_error(self, status: int) -> str:
        if status == 401:
            return (f"the daemon at {self.address.url} wants basic auth: --user NAME with the password in "
                    f"${PASSWORD_ENV}" + (" (refused)" if self.address.user else ""))
        if status == 404:
            if urllib.parse.urlsplit(self.address.url).path:
                return (f"nothing serves {self.url} (HTTP 404): --url is the daemon's base URL, "
                        f"e.g. {self.address.url.split('//')[0]}//{urllib.parse.urlsplit(self.address.url).netloc}")
            return f"the daemon at {self.address.url} does not serve {API_PATH} (a gpuperfd older than `top`?)"
        return f"the daemon at {self.address.url} answered HTTP {status} for {API_PATH}"

    def close(self) -> None:
        pass
