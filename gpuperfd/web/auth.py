"""Basic authentication from ``basic_auth_users``: the request gate, bcrypt with a cache and a
decoy hash so unknown users cost as much as known ones."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterator
from functools import lru_cache
from http.server import BaseHTTPRequestHandler

from prometheus_client.core import CounterMetricFamily, Metric

from gpuperfd.web.config import BCRYPT_HASH, REALM, WebSecurity
from gpuperfd.web.server import RequestGate, Response
from gpuperfd.web.watcher import SecurityProvider, WebConfigWatcher, as_provider


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


#: Seconds a client refused for a busy credential check is told to wait (``Retry-After``).
RETRY_AFTER_SECONDS = 1


def _busy() -> Response:
    return Response(
        429, b"Too many credential checks at once; retry later\n", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
    )


class BasicAuthGate(RequestGate):
    """401 unless the request carries a user and password from ``basic_auth_users``.

    bcrypt is slow on purpose (tens of milliseconds at cost 10), so results are
    cached, keyed by a keyed hash of user, stored hash and password: the first
    scrape with a password pays bcrypt, the rest hit the cache; changing a
    password in the file changes the stored hash, so old entries stop matching.
    Unknown users are checked against a decoy hash so their timing matches known ones.

    bcrypt runs one at a time, and a request that would have to wait for it is
    refused at once (429 with ``Retry-After``, counted in ``refused``) instead of
    holding one of the server's few workers: so a flood of wrong passwords keeps
    at most one worker busy, and a scrape whose credentials are cached (a dict
    lookup) never waits behind a bcrypt check. The price: a second client with
    a new, uncached password arriving during a check is told to retry.
    """

    def __init__(
        self,
        security: WebConfigWatcher | WebSecurity | SecurityProvider,
        *,
        open_paths: frozenset[str] | set[str] = frozenset(),
        cache_size: int = 256,
    ) -> None:
        self._security = as_provider(security)
        self.open_paths = frozenset(open_paths)
        self._cache: OrderedDict[bytes, bool] = OrderedDict()
        self._cache_size = cache_size
        self._cache_lock = threading.Lock()
        self._bcrypt_slot = threading.Lock()
        self._key = secrets.token_bytes(32)
        self.bcrypt_calls = 0  # for tests and debugging
        #: Requests refused with 429 because a credential check was already running.
        self.refused = 0

    def check(self, handler: BaseHTTPRequestHandler) -> Response | None:
        security = self._security()
        if not security.users:
            return None
        if self.open_paths and handler.path.split("?", 1)[0] in self.open_paths:
            return None
        credentials = parse_basic_auth(handler.headers.get("Authorization"))
        if credentials is None:
            return _unauthorized()
        verdict = self.verify(security, *credentials, wait=False)
        if verdict is None:
            with self._cache_lock:
                self.refused += 1
            return _busy()
        return None if verdict else _unauthorized()

    def verify(self, security: WebSecurity, user: str, password: bytes, *, wait: bool = True) -> bool | None:
        """Whether ``password`` is right for ``user`` under ``security`` (cached). ``wait=False``:
        None instead of waiting when the answer is not cached and another check is running."""
        hashed = security.users.get(user)
        known = hashed is not None
        if hashed is None:
            match = BCRYPT_HASH.match(next(iter(security.users.values())).decode()) if security.users else None
            hashed = _decoy_hash(int(match.group(1)) if match else 10)
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in (user.encode("utf-8"), hashed, password):
            mac.update(len(part).to_bytes(4, "big") + part)
        key = mac.digest()
        cached = self._cached(key)
        if cached is None:
            if not self._bcrypt_slot.acquire(blocking=wait):
                return None
            try:
                cached = self._cached(key)  # another thread may have just computed it
                if cached is None:
                    self.bcrypt_calls += 1
                    cached = _bcrypt_check(password, hashed) and known
                    with self._cache_lock:
                        self._cache[key] = cached
                        while len(self._cache) > self._cache_size:
                            self._cache.popitem(last=False)
            finally:
                self._bcrypt_slot.release()
        return cached and known

    def collect(self) -> Iterator[Metric]:
        """``gpuperf_web_auth_refused_total`` for /metrics (the gate is a prometheus_client collector)."""
        family = CounterMetricFamily(
            "gpuperf_web_auth_refused",
            "Requests refused at once with 429 (Retry-After) because a basic-auth password check was already "
            "running; a flood of new or wrong passwords shows here.",
        )
        family.add_metric([], float(self.refused))
        yield family

    def describe(self) -> Iterator[Metric]:
        yield from self.collect()

    def _cached(self, key: bytes) -> bool | None:
        with self._cache_lock:
            value = self._cache.get(key)
            if value is not None:
                self._cache.move_to_end(key)
            return value


