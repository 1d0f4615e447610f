"""Messages between a probe child and its parent: JSON over a pipe, never a pickle.

Why: ``Connection.send`` pickles, and unpickling imports whatever module defined each
object. One ``numpy.float64`` or ``torch.Size`` in a result made the daemon import
numpy and torch (RSS 44 -> 240 MB on a CPU, 68 -> 540 MB on an H200 node). JSON can
only carry dicts, lists, strings, numbers, booleans and null, so nothing can be
imported on the receiving side. The sender turns foreign scalars and arrays into
plain numbers and lists first (:func:`plain`).

Each message is ``[kind, body]`` with ``body`` a dict:

====================  =========  ==================================================
kind                  from       body
====================  =========  ==================================================
``progress``          child      phase, repeat, ... (for a progress bar)
``ready``             child      the workload is built: ``setup_seconds``, ``import_seconds``, identity
``result``            child      a ``ProbeResult.to_dict()``
``error``             child      reason, message, traceback, identity; the child then exits
``measure``           parent     ``power_limit_watts`` (the cap the parent set), ``settle_seconds``
``build``             parent     ``spec``: drop the workload, build this probe instead; ``ready`` follows
``stop``              parent     (empty) the child exits
====================  =========  ==================================================

Pure standard library: both sides import it.
"""

from __future__ import annotations

import json
import select
import socket
import struct
from typing import Any

__all__ = ["send", "recv", "plain", "encode", "decode", "Channel"]

_LENGTH = struct.Struct("!I")
#: A message larger than this is refused (a result is a few KB; a garbled length must not allocate GBs).
MAX_MESSAGE_BYTES = 64 << 20


class Channel:
    """One end of the parent-child socket: length-prefixed byte messages, and ``poll``.

    The same face as ``multiprocessing.connection.Connection`` (``send_bytes``, ``recv_bytes``,
    ``poll``, ``close``) without importing ``multiprocessing`` into the daemon: that package was
    the daemon's only use of it (about 1 MB resident).
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        self._sock = sock

    @classmethod
    def from_fd(cls, fd: int) -> Channel:
        return cls(socket.socket(fileno=fd))

    def fileno(self) -> int:
        return self._sock.fileno()

    def send_bytes(self, data: bytes) -> None:
        self._sock.sendall(_LENGTH.pack(len(data)) + data)

    def _exactly(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self._sock.recv(min(left, 1 << 20))
            if not chunk:
                raise EOFError("the other end closed the channel")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def recv_bytes(self) -> bytes:
        (size,) = _LENGTH.unpack(self._exactly(_LENGTH.size))
        if size > MAX_MESSAGE_BYTES:
            raise ValueError(f"message of {size} bytes is larger than {MAX_MESSAGE_BYTES}")
        return self._exactly(size)

    def poll(self, timeout: float = 0.0) -> bool:
        """True when a message (or the end of the channel) can be read now or within ``timeout`` s."""
        # poll(2), not select(2): a daemon with hundreds of connections has descriptors above 1023.
        poller = select.poll()
        poller.register(self._sock, select.POLLIN | select.POLLHUP | select.POLLERR)
        return bool(poller.poll(max(timeout, 0.0) * 1000.0))

    def close(self) -> None:
        self._sock.close()


def plain(value: Any) -> Any:
    """``json.dumps``'s fallback: numpy/torch scalars via ``item()``, arrays via ``tolist()``,
    sets as sorted lists, anything else as its ``str``."""
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (TypeError, ValueError):  # an array of several elements
            pass
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    if isinstance(value, tuple):
        return list(value)
    return str(value)


def _clean(value: Any) -> Any:
    """Subclasses of float/int (numpy.float64 is one) become the builtin type: json would keep
    them as they are, and a later pickle (multiprocessing) of the decoded data must stay plain."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return _clean(plain(value))


def encode(kind: str, body: dict[str, Any] | None = None) -> bytes:
    """One message as UTF-8 JSON bytes (NaN and infinities are kept, as Python's json does)."""
    return json.dumps([kind, _clean(body or {})], separators=(",", ":")).encode()


def decode(data: bytes) -> tuple[str, dict[str, Any]]:
    """The (kind, body) of one message; ValueError for anything that is not one."""
    message = json.loads(data.decode())
    if not (isinstance(message, list) and len(message) == 2 and isinstance(message[0], str)
            and isinstance(message[1], dict)):
        raise ValueError("not a probe message: expected [kind, {body}]")
    return message[0], message[1]


def send(conn: Any, kind: str, body: dict[str, Any] | None = None) -> None:
    """Send one message over a :class:`Channel` (or any ``send_bytes``) as bytes (no pickle)."""
    conn.send_bytes(encode(kind, body))


def recv(conn: Any) -> tuple[str, dict[str, Any]]:
    """Receive one message; EOFError/OSError when the other side is gone, ValueError when garbled."""
    return decode(conn.recv_bytes())

