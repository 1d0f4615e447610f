"""Re-reads the web config file (and the files it names) on change or SIGHUP; a file that does
not load is logged and the previous settings stay, and basic auth is never turned off by a file
that does not say so (an empty, half-written or ``basic_auth_users: null`` file keeps it on)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpuperfd.web.config import (
    WebConfigError,
    WebSecurity,
    files_fingerprint,
    load_web_config,
)

log = logging.getLogger(__name__)

class WebConfigWatcher:
    """The current :class:`WebSecurity` of one file, re-read when the file or its certificates change.

    :meth:`current` is called on every request and connection; at most once per
    ``check_interval`` seconds it hashes the files (a few KiB) and, if anything
    changed, loads them anew. A file that fails to load is logged once (per
    content) and the previous settings stay in force.

    Authentication never falls open by accident: while basic auth is on, a
    file without users (empty, cut short mid-write, ``basic_auth_users: null``
    or missing the key) is refused like an invalid one. Turning it off takes a
    complete, valid file with ``basic_auth_users: {}``, and is logged at warning.
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
        if old.auth_required and not new.auth_required:
            if not new.auth_off_stated:
                self._rejected = fingerprint
                log.error(
                    "web config %s not reloaded, keeping the previous settings: it lists no basic_auth_users "
                    "(empty, half written or null), which would turn basic auth off; "
                    "to turn it off on purpose, write `basic_auth_users: {}`", self.path,
                )
                return False
            log.warning("web config %s turns basic auth OFF (basic_auth_users: {}): requests need no password now",
                        self.path)
        self._rejected = None
        self._security = new
        if new.fingerprint != old.fingerprint:
            log.info("web config %s reloaded: %s", self.path, new.describe())
        return new.fingerprint != old.fingerprint


#: Something that returns the settings in force now.
SecurityProvider = Callable[[], WebSecurity]


def as_provider(source: WebConfigWatcher | WebSecurity | SecurityProvider) -> SecurityProvider:
    if isinstance(source, WebConfigWatcher):
        return source.current
    if isinstance(source, WebSecurity):
        return lambda: source
    return source


